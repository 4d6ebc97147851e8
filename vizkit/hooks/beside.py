"""Attention maps computed beside the fused kernel, for read-only capture.

A fused attention kernel (``F.scaled_dot_product_attention``) never builds the (N, N) map; the
default capture switches the module to its explicit path for the call (`unfused_attention`), which
then computes the block's output through the map. Under half precision on a GPU that explicit path
is much slower than the fused kernel, so a read-only capture can instead leave the kernel computing
the output and build the map on the side, from the same normalized queries and keys the kernel
gets and with the explicit path's own operations, so the map equals the unfused path's map. A
family offers this for the attention classes whose forward it knows op for op
(`vizkit.hooks.readers.ExplicitPathReader.beside`; timm's ``Attention``:
`vizkit.families.timm.vit`); a gradient or an edit of the map needs the map
on the output's path, so those runs always use the explicit path.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PATTERN_PATHS", "beside_is_faster"]

PATTERN_PATHS = ("auto", "unfused", "beside")
_HALF = (torch.float16, torch.bfloat16)


def beside_is_faster(model: nn.Module) -> bool:
    """Whether ``model``'s attention maps are cheaper beside the fused kernel than through the
    explicit path, for a forward run now (autocast is read from the current context).

    Measured on an H100 (ViT-B/16 batch 64, ViT-L/16 batch 32): under bfloat16 autocast the fused
    kernel plus a map beside it cost 1.45x / 1.37x a plain forward, the explicit path 1.86x /
    1.75x; in float32 the explicit path costs 1.07x. On a CPU the two cost the same (deit_small,
    batch 16: beside 1.17x, explicit 1.18x). So: beside on a GPU in half precision, the explicit
    path everywhere else.
    """
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cuda":
        return False
    if torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") in _HALF:
        return True
    return parameter.dtype in _HALF
