"""MaxViT / MaxxViT (Tu et al. 2022): the attention blocks are ``attn_block`` (local windows) and
``attn_grid`` (a dilated grid) of each stage block; their stream is channels-last
(B, gh, gw, C) at the stage's reduction (timm ``feature_info``; padded convolutions round up)."""

from __future__ import annotations

from collections.abc import Callable

from timm.models import maxxvit
from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured
from ...hooks.windows import WindowGeometry
from ..grids import divided
from .common import PRE_NORM, has_position_bias, position_bias

__all__ = ["layout"]


def layout(model: maxxvit.MaxxVit) -> FamilyLayout:
    reductions = {f["module"]: f["reduction"] for f in model.feature_info}
    blocks = []
    for s, stage in enumerate(model.stages):
        grid = divided(reductions[f"stages.{s}"], ceil=True)
        for i, block in enumerate(stage.blocks):
            for part in ("attn_block", "attn_grid"):
                if isinstance(getattr(block, part, None), maxxvit.PartitionAttentionCl):
                    blocks.append(
                        BlockSite(f"stages.{s}.blocks.{i}.{part}", tokens="Np", prefix_tokens=0,
                                  grid=grid, channels_last=True)
                    )  # fmt: skip
    return FamilyLayout("maxvit", blocks, [])


def _geometry(block: nn.Module, attn: nn.Module) -> Callable[[], WindowGeometry]:
    """Block attention: windows; grid attention: a dilated grid of that size."""
    return lambda: WindowGeometry(tuple(block.partition_size), dilated=not block.partition_block)


FAMILY = register_family(
    Family(
        "maxvit",
        "timm",
        models={maxxvit.MaxxVit: layout},
        blocks={maxxvit.PartitionAttentionCl: PRE_NORM},
        attention={
            maxxvit.AttentionCl: captured(
                "window",
                position=position_bias,
                has_position=has_position_bias,
                geometry=_geometry,
            )
        },  # fmt: skip
    )
)
