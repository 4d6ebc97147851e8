"""NaFlexViT on an image batch (B, C, H, W): one (H / ph, W / pw) grid for every image. Its
NaFlex input (a dict of patches with per-image grids and padding) is refused by
`vizkit.hooks.validate_input`. Its blocks are timm's ViT blocks (`vizkit.families.timm.vit`)."""

from __future__ import annotations

from timm.models import naflexvit

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ..grids import divided
from .common import final_norm_taps
from .vit import head_prefix_tokens

__all__ = ["layout"]


def layout(model: naflexvit.NaFlexVit) -> FamilyLayout:
    pad = getattr(model.embeds, "dynamic_img_pad", False)  # padded up to whole patches
    grid = divided(model.embeds.patch_size[0], ceil=pad)
    prefix = model.num_prefix_tokens
    blocks = [
        BlockSite(f"blocks.{i}", prefix_tokens=prefix, grid=grid) for i in range(len(model.blocks))
    ]
    return FamilyLayout(
        "naflexvit", blocks, final_norm_taps(model, prefix_tokens=prefix, grid=grid),
        head_prefix_tokens=head_prefix_tokens(model),
    )  # fmt: skip


FAMILY = register_family(Family("naflexvit", "timm", models={naflexvit.NaFlexVit: layout}))
