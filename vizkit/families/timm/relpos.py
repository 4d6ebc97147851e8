"""timm's ViT with relative position biases (``vision_transformer_relpos``): blocks over
[prefix, patches], each attention's bias (or one shared across layers) as ``hook_pos_bias``."""

from __future__ import annotations

from timm.models import vision_transformer_relpos as relpos

from ...hooks.family import Family, register_family
from ...hooks.sites import captured
from .common import POST_NORM, PRE_NORM, flat_layout, has_position_bias, position_bias

__all__ = ["layout"]

layout = flat_layout("relpos")


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
