"""Attention maps computed beside the fused kernel, for read-only capture.

timm's fused attention (``F.scaled_dot_product_attention``) never builds the (N, N) map; the
default capture switches the module to its explicit path for the call (`unfused_attention`), which
then computes the block's output through the map. Under half precision on a GPU that explicit path
is much slower than the fused kernel, so a read-only capture can instead leave the kernel computing
the output and build the map on the side, from the same normalized queries and keys the kernel
gets (forward hooks on ``q_norm`` and ``k_norm``) and with the explicit path's own operations::

    softmax((q · scale) kᵀ + mask)        q, k: (B, H, N, d) after q_norm / k_norm

so the map equals the unfused path's map, in its dtype (float32 under CUDA autocast, which runs
softmax in float32; the model's dtype otherwise). Only modules whose forward is known op for op
take part (`BESIDE_CLASSES`); a gradient or an edit of the map needs the map on the output's
path, so those runs always use the explicit path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from timm.layers.attention import Attention, maybe_add_mask, resolve_self_attn_mask
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

__all__ = ["BESIDE_CLASSES", "PATTERN_PATHS", "attach_beside", "beside_is_faster"]

BESIDE_CLASSES = (Attention,)  # exact classes: a subclass may change the forward
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


def attach_beside(attn: nn.Module, on_map: Callable[[Tensor], None]) -> list[RemovableHandle]:
    """Hooks that call ``on_map`` with the (B, H, N, N) map of ``attn`` (one of
    `BESIDE_CLASSES`) each time it runs, leaving its forward (fused or not) untouched.

    Returns:
        the handles to remove.
    """
    seen: dict[str, Any] = {}

    def read_mask(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["mask"] = kwargs.get("attn_mask", args[1] if len(args) > 1 else None)
        seen["causal"] = kwargs.get("is_causal", args[2] if len(args) > 2 else False)

    def read_query(module: nn.Module, args: tuple, output: Tensor) -> None:
        seen["q"] = output

    def make_map(module: nn.Module, args: tuple, k: Tensor) -> None:
        q = seen.pop("q") * attn.scale
        logits = q @ k.transpose(-2, -1)
        bias = resolve_self_attn_mask(k.shape[-2], logits, seen["mask"], seen["causal"])
        on_map(maybe_add_mask(logits, bias).softmax(dim=-1))

    return [
        attn.register_forward_pre_hook(read_mask, with_kwargs=True),
        attn.q_norm.register_forward_hook(read_query),
        attn.k_norm.register_forward_hook(make_map),
    ]
