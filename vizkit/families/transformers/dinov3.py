"""Hugging Face transformers' DINOv3 ViT (Siméoni et al. 2025, "DINOv3"): pre-norm blocks
``model.layer.{i}`` over [class, registers, patches] with rotary position embeddings applied
inside the attention, LayerScale ``layer_scale{1,2}.lambda1``, one ``drop_path`` module closing
both branches (its first and second call). The map is the weights the attention returns under
eager attention, after RoPE, as in DINOv2."""

from __future__ import annotations

from ...hooks.family import Family, register_family
from .common import returned_map
from .dinov2 import DINO_LAYER, dino_layout

__all__ = ["layout"]

_DINO = "transformers.models.dinov3_vit.modeling_dinov3_vit"

# ``DINOv3ViTModel``: embeddings, ``model.layer.{i}``, ``norm``
layout = dino_layout("dinov3", "model.layer", "norm")

FAMILY = register_family(
    Family(
        "dinov3",
        "transformers",
        models={f"{_DINO}:DINOv3ViTModel": layout},
        blocks={f"{_DINO}:DINOv3ViTLayer": DINO_LAYER},
        attention={f"{_DINO}:DINOv3ViTAttention": returned_map},
    )
)
