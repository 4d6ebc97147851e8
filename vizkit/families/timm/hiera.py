"""Hiera (Ryali et al. 2023): tokens are unrolled (mask units first) until the last stage; only
raster blocks get a grid, the others refuse one. Mask-unit attention maps (Sec. 3; queries
max-pooled where the block pools) are recomputed from the attention's input."""

from __future__ import annotations

from typing import Any

from timm.models import hiera
from torch import Tensor, nn

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import recomputed
from ...hooks.taps import GridFn
from .common import PRE_NORM

__all__ = ["hiera_pattern", "layout"]


def layout(model: hiera.Hiera) -> FamilyLayout:
    blocks, schedule = [], model.reroll.schedule
    for i in range(len(model.blocks)):
        blocks.append(
            BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0,
                      grid=_grid(schedule[i]), input_grid=_grid(schedule.get(i - 1)))
        )  # fmt: skip
    return FamilyLayout("hiera", blocks, [])


def _grid(schedule) -> GridFn:
    if schedule is None:  # block 0's input: the patch embedding, unrolled
        schedule = ([(2, 2)], None)

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        steps, size = schedule
        if steps:
            raise ValueError(
                "Hiera holds these tokens in its unrolled order (mask units first), not on a "
                "raster grid, so they cannot be drawn as a map; only its last stage is raster. "
                "Use the last block (blocks.-1), or Hiera's own model.reroll(x, block_index)."
            )
        return tuple(size)

    return grid


def hiera_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, nW, Nq, Nk) inside each mask unit, or (B, H, Nq, Nk) for global attention, in
    Hiera's unrolled token order (not raster order)."""
    x = args[0]
    batch, tokens, _ = x.shape
    heads, head_dim, stride = attn.heads, attn.head_dim, attn.q_stride
    if attn.use_mask_unit_attn:
        windows = tokens // (stride * attn.window_size)
        qkv = attn.qkv(x).reshape(batch, -1, windows, 3, heads, head_dim).permute(3, 0, 4, 2, 1, 5)
        q, k = qkv[0], qkv[1]
        if stride > 1:
            q = q.view(batch, heads, windows, stride, -1, head_dim).amax(dim=3)
    else:
        q, k = attn.qkv(x).reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)[:2]
        if stride > 1:
            q = q.view(batch, heads, stride, -1, head_dim).amax(dim=2)
    return ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)


FAMILY = register_family(
    Family(
        "hiera",
        "timm",
        models={hiera.Hiera: layout},
        blocks={hiera.HieraBlock: PRE_NORM},
        attention={
            hiera.MaskUnitAttention: recomputed("unrolled", hiera_pattern, shape="B H [nW] Nq Nk")
        },
    )
)
