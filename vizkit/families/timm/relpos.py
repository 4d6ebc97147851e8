"""timm's ViT with relative position biases (``vision_transformer_relpos``): blocks over
[prefix, patches], each attention's bias (or one shared across layers) as ``hook_pos_bias``."""

from __future__ import annotations

from timm.models import vision_transformer_relpos as relpos

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured
from .common import (
    POST_NORM,
    PRE_NORM,
    embed_tap,
    final_norm_taps,
    has_position_bias,
    position_bias,
)

__all__ = ["layout"]


def layout(model: relpos.VisionTransformerRelPos) -> FamilyLayout:
    blocks = [BlockSite(f"blocks.{i}") for i in range(len(model.blocks))]
    return FamilyLayout("relpos", blocks, [embed_tap(), *final_norm_taps(model)])


FAMILY = register_family(
    Family(
        "relpos",
        "timm",
        models={relpos.VisionTransformerRelPos: layout},
        blocks={relpos.RelPosBlock: PRE_NORM, relpos.ResPostRelPosBlock: POST_NORM},
        attention={
            relpos.RelPosAttention: captured(
                "self", position=position_bias, has_position=has_position_bias
            )
        },
    )
)
