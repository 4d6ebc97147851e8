"""Twins (Chu et al. 2021): four stages, each with its own patch embedding (no prefix tokens);
locally-grouped attention in windows and global attention over sub-sampled keys."""

from __future__ import annotations

from collections.abc import Callable

from timm.models import twins
from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured
from ...hooks.windows import WindowGeometry
from ..grids import divided
from .common import PRE_NORM

__all__ = ["layout"]


def layout(model: twins.Twins) -> FamilyLayout:
    blocks, size = [], 1
    for s, stage in enumerate(model.blocks):
        size *= model.patch_embeds[s].patch_size[0]
        grid = divided(size)
        blocks += [BlockSite(f"blocks.{s}.{i}", tokens="Np", prefix_tokens=0, grid=grid)
                   for i in range(len(stage))]  # fmt: skip
    return FamilyLayout("twins", blocks, [])


def _geometry(block: nn.Module, attn: nn.Module) -> Callable[[], WindowGeometry]:
    return lambda: WindowGeometry((attn.ws, attn.ws))


FAMILY = register_family(
    Family(
        "twins",
        "timm",
        models={twins.Twins: layout},
        blocks={twins.Block: PRE_NORM},
        attention={
            twins.LocallyGroupedAttn: captured("window", geometry=_geometry),
            twins.GlobalSubSampleAttn: captured("pooled"),
        },
    )
)
