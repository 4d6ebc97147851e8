"""Swin and Swin V2 (Liu et al. 2021, 2022): ``layers.{s}`` merge 2 x 2 patches first (s > 0),
then run blocks on a channels-last (B, gh, gw, C) map; the stage grid is the patch grid halved
(rounded up). Attention inside (shifted) windows, put back on the grid by
`vizkit.hooks.windows`; each block's relative position bias as ``hook_pos_bias``."""

from __future__ import annotations

from collections.abc import Callable

from timm.models import swin_transformer as swin
from timm.models import swin_transformer_v2 as swinv2
from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured
from ...hooks.taps import Tap, nhwc_to_nchw, nhwc_to_nlc
from ...hooks.windows import WindowGeometry
from ..grids import scaled_patch_grid
from .common import POST_NORM, PRE_NORM, embed_tap, has_position_bias, position_bias

__all__ = ["layout"]


def layout(model: nn.Module) -> FamilyLayout:
    blocks, extra, scale = [], [embed_tap(prefix_tokens=0)], 1
    for s, stage in enumerate(model.layers):
        scale *= 1 if isinstance(stage.downsample, nn.Identity) else 2
        grid = scaled_patch_grid(model, scale)
        blocks += [
            BlockSite(f"layers.{s}.blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid,
                      channels_last=True)
            for i in range(len(stage.blocks))
        ]  # fmt: skip
        extra.append(Tap(f"layers.{s}.hook_out", f"layers.{s}", shape="B C gh gw", **nhwc_to_nchw))
    extra.append(
        Tap("hook_final_norm", "norm", shape="B Np C", prefix_tokens=0, grid=grid, **nhwc_to_nlc)
    )
    return FamilyLayout("swin", blocks, extra, merges_patches=True)


def _geometry(block: nn.Module, attn: nn.Module) -> Callable[[], WindowGeometry]:
    """The block's windows and shift, read when asked (Swin shrinks windows and drops shifts
    on small grids)."""
    return lambda: WindowGeometry(tuple(block.window_size), tuple(block.shift_size))


_WINDOWS = captured(
    "window", position=position_bias, has_position=has_position_bias, geometry=_geometry
)

FAMILY = register_family(
    Family(
        "swin",
        "timm",
        models={swin.SwinTransformer: layout, swinv2.SwinTransformerV2: layout},
        blocks={swin.SwinTransformerBlock: PRE_NORM, swinv2.SwinTransformerV2Block: POST_NORM},
        attention={swin.WindowAttention: _WINDOWS, swinv2.WindowAttention: _WINDOWS},
    )
)
