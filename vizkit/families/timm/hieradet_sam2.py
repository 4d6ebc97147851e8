"""SAM2's Hiera (``hieradet_sam2``): attention on a (B, h, w, C) map, queries max-pooled where
the block downsamples; maps recomputed from the module's input, named as captured (kind
"unplaced")."""

from __future__ import annotations

from typing import Any

from timm.models import hieradet_sam2
from torch import Tensor, nn

from ...hooks.family import Family, register_family
from ...hooks.sites import recomputed

__all__ = ["pooled_query_pattern"]


def pooled_query_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, N): the attention of a (B, h, w, C) map, queries pooled by ``q_pool``."""
    x = args[0]
    batch, height, width, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(batch, height * width, 3, attn.num_heads, -1).unbind(2)
    if attn.q_pool is not None:
        q = attn.q_pool(q.reshape(batch, height, width, -1).permute(0, 3, 1, 2))
        q = q.permute(0, 2, 3, 1).reshape(batch, -1, attn.num_heads, k.shape[-1])
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    return ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)


FAMILY = register_family(
    Family(
        "hieradet_sam2",
        "timm",
        unplaced={
            hieradet_sam2.MultiScaleAttention: recomputed(
                "unplaced", pooled_query_pattern, shape="as computed"
            )
        },
    )
)
