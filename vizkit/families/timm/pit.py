"""PiT (Heo et al. 2021): stage s pools the (B, C, gh, gw) map by 2 (a stride-2 depthwise
convolution, grid rounded up) and runs ViT blocks on [class (+ distillation), patches]."""

from __future__ import annotations

from timm.models import pit

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ..grids import conv_grid

__all__ = ["layout"]


def layout(model: pit.PoolingVisionTransformer) -> FamilyLayout:
    conv, prefix = model.patch_embed.conv, model.cls_token.shape[1]
    blocks = []
    for s, stage in enumerate(model.transformers):
        grid = conv_grid(conv, 2**s)
        blocks += [
            BlockSite(f"transformers.{s}.blocks.{i}", prefix_tokens=prefix, grid=grid)
            for i in range(len(stage.blocks))
        ]
    return FamilyLayout("pit", blocks, [])


FAMILY = register_family(Family("pit", "timm", models={pit.PoolingVisionTransformer: layout}))
