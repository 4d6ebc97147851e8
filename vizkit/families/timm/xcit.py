"""XCiT (El-Nouby et al. 2021): cross-covariance attention over channels
(``attn.hook_channel_pattern``, (B, H, C/H, C/H)) on the patches, then class-attention blocks
where the class token joins (their maps are XCiT's maps over tokens)."""

from __future__ import annotations

from timm.models import xcit

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured
from ..grids import divided
from .common import final_norm_taps

__all__ = ["layout"]


def layout(model: xcit.Xcit) -> FamilyLayout:
    grid = divided(model.patch_embed.patch_size, ceil=True)  # stride-2 padded convolutions
    blocks = [  # XCA blocks hold patches only; the class token joins for class attention
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid)
        for i in range(len(model.blocks))
    ]
    blocks += [
        BlockSite(f"cls_attn_blocks.{j}", prefix_tokens=1, grid=grid)
        for j in range(len(model.cls_attn_blocks))
    ]
    return FamilyLayout("xcit", blocks, final_norm_taps(model, prefix_tokens=1, grid=grid))


FAMILY = register_family(
    Family(
        "xcit",
        "timm",
        models={xcit.Xcit: layout},
        attention={xcit.XCA: captured("channel", leaf="hook_channel_pattern")},
    )
)
