"""MViTv2 (Li et al. 2022): blocks that pool their queries (stride s) shrink the grid to
ceil(g / s); the class token (``*_cls`` models) rides along. Pooling-attention maps
(Sec. 3.1: queries and keys pooled, softmax(q kᵀ scale + decomposed relative positions)) are
recomputed from the attention's input."""

from __future__ import annotations

import dataclasses
from typing import Any

from timm.models import mvitv2
from torch import Tensor, nn

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import recomputed
from ..grids import divided, halved
from .common import PRE_NORM

__all__ = ["layout", "mvit_pattern"]


def layout(model: mvitv2.MultiScaleVit) -> FamilyLayout:
    prefix, grid, blocks = model.num_prefix_tokens, divided(4, ceil=True), []
    for s, stage in enumerate(model.stages):
        for i, block in enumerate(stage.blocks):
            before = grid
            pool = block.attn.pool_q
            if pool is not None and tuple(pool.stride) != (1, 1):
                grid = halved(grid, 1, stride=pool.stride[0])
            blocks.append(
                BlockSite(f"stages.{s}.blocks.{i}", prefix_tokens=prefix, grid=grid,
                          input_grid=before)
            )  # fmt: skip
    return FamilyLayout("mvitv2", blocks, [])


def mvit_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, Nk): an MViTv2 pooling-attention map."""
    x = args[0]
    grid = args[1] if len(args) > 1 else kwargs["feat_size"]
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, q_size = _pooled(attn, qkv[0], grid, attn.pool_q, attn.norm_q)
    k, k_size = _pooled(attn, qkv[1], grid, attn.pool_k, attn.norm_k)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    if attn.rel_pos_type == "spatial":
        logits = mvitv2.cal_rel_pos_type(
            logits, q, attn.has_cls_token, q_size, k_size, attn.rel_pos_h, attn.rel_pos_w
        )
    return logits.softmax(-1)


def _pooled(attn: nn.Module, t: Tensor, grid, pool: nn.Module | None, norm):
    size = grid
    if pool is not None:
        t, token = mvitv2.reshape_pre_pool(t, grid, attn.has_cls_token)
        t, size = mvitv2.reshape_post_pool(pool(t), attn.num_heads, token)
    return (norm(t) if norm is not None else t), size


def _kind(attn: nn.Module) -> str:
    """ "pooled" where the attention pools its queries or keys (Nq or Nk below N)."""
    pools = (attn.pool_q, attn.pool_k)
    return "pooled" if any(p is not None and tuple(p.stride) != (1, 1) for p in pools) else "self"


FAMILY = register_family(
    Family(
        "mvitv2",
        "timm",
        models={mvitv2.MultiScaleVit: layout},
        # forward returns (x, feature grid)
        blocks={mvitv2.MultiScaleBlock: dataclasses.replace(PRE_NORM, output_item=0)},
        attention={mvitv2.MultiScaleAttention: recomputed(_kind, mvit_pattern)},
    )
)
