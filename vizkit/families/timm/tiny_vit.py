"""TinyViT (Wu et al. 2022): LeViT-style biased attention in windows of a convolutional
network's later stages; its maps are recomputed from the module's input and named as captured
(kind "unplaced": vizkit has no token layout for them)."""

from __future__ import annotations

from timm.models import tiny_vit

from ...hooks.family import Family, register_family
from ...hooks.sites import recomputed
from .efficientformer import biased_attention_pattern

_SITE = recomputed("unplaced", biased_attention_pattern, shape="as computed")

FAMILY = register_family(
    Family(
        "tiny_vit",
        "timm",
        unplaced={tiny_vit.Attention: _SITE},
    )
)
