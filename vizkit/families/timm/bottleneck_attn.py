"""BoTNet's bottleneck self-attention (timm ``BottleneckAttn``, in ``byoanet`` models) over a
(B, C, h, w) map, with its relative-position logits; recomputed from the module's input, named
as captured (kind "unplaced")."""

from __future__ import annotations

from typing import Any

import torch
from timm.layers.bottleneck_attn import BottleneckAttn
from torch import Tensor, nn

from ...hooks.family import Family, register_family
from ...hooks.sites import recomputed

__all__ = ["bottleneck_pattern"]


def bottleneck_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): the map, with ``pos_embed``'s logits (a function of q)."""
    x = args[0]
    batch, heads = x.shape[0], attn.num_heads
    q, k, _ = torch.split(attn.qkv(x), [attn.dim_out_qk, attn.dim_out_qk, attn.dim_out_v], dim=1)
    q = q.reshape(batch * heads, attn.dim_head_qk, -1).transpose(-1, -2)
    k = k.reshape(batch * heads, attn.dim_head_qk, -1)
    if attn.scale_pos_embed:
        logits = (q @ k + attn.pos_embed(q)) * attn.scale
    else:
        logits = (q @ k) * attn.scale + attn.pos_embed(q)
    return logits.softmax(-1).unflatten(0, (batch, heads))


FAMILY = register_family(
    Family(
        "bottleneck_attn",
        "timm",
        unplaced={BottleneckAttn: recomputed("unplaced", bottleneck_pattern, shape="as computed")},
    )
)
