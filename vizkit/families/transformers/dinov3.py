"""Hugging Face transformers' DINOv3 ViT (Siméoni et al. 2025, "DINOv3"): pre-norm blocks
``model.layer.{i}`` over [class, registers, patches] with rotary position embeddings applied
inside the attention, LayerScale ``layer_scale{1,2}.lambda1``, one ``drop_path`` module closing
both branches (its first and second call). The map is the weights the attention returns under
eager attention, after RoPE, as in DINOv2."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import embedding_tokens, returned_map

__all__ = ["layout"]

_DINO = "transformers.models.dinov3_vit.modeling_dinov3_vit"


def layout(model: nn.Module) -> FamilyLayout:
    """``DINOv3ViTModel``: embeddings, ``model.layer.{i}``, ``norm``."""
    blocks = [BlockSite(f"model.layer.{i}") for i in range(len(model.model.layer))]
    extra = [Tap("hook_final_norm", "norm", shape="B N C")]
    return FamilyLayout(
        "dinov3", blocks, extra, tokens=embedding_tokens(model.embeddings), reads_class_token=True
    )


_LAYER = ResidualSpec(
    "drop_path", "drop_path", "norm2", scales=("layer_scale1.lambda1", "layer_scale2.lambda1")
)

FAMILY = register_family(
    Family(
        "dinov3",
        "transformers",
        models={f"{_DINO}:DINOv3ViTModel": layout},
        blocks={f"{_DINO}:DINOv3ViTLayer": _LAYER},
        attention={f"{_DINO}:DINOv3ViTAttention": returned_map},
    )
)
