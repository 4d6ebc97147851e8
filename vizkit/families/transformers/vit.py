"""Hugging Face transformers' ViT, DeiT and ViTMAE's encoder (``ViTModel``, ``DeiTModel``,
``ViTMAEModel`` through `vizkit.models.unmasked_mae`; found inside
``ViTForImageClassification``, ``DeiTForImageClassificationWithTeacher``, ``AutoModel...`` or
a module of your own): pre-norm blocks ``layers.{i}`` over [class (, distillation), patches],
one ``dropout`` module closing both branches (its first and second call)."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import embedding_tokens, returned_map

__all__ = ["layout"]

_VIT = "transformers.models.vit.modeling_vit"
_DEIT = "transformers.models.deit.modeling_deit"
_MAE = "transformers.models.vit_mae.modeling_vit_mae"  # through vizkit.models.unmasked_mae


def layout(model: nn.Module) -> FamilyLayout:
    """``ViTModel`` / ``DeiTModel``: embeddings, ``layers.{i}``, ``layernorm``."""
    blocks = [BlockSite(f"layers.{i}") for i in range(len(model.layers))]
    extra = [Tap("hook_final_norm", "layernorm", shape="B N C")]
    return FamilyLayout(
        "vit", blocks, extra, tokens=embedding_tokens(model.embeddings), reads_class_token=True
    )


# x + dropout(attention(layernorm_before(x))); x + dropout(mlp(layernorm_after(x)))
_LAYER = ResidualSpec("dropout", "dropout", "layernorm_after")

FAMILY = register_family(
    Family(
        "vit",
        "transformers",
        models={
            f"{_VIT}:ViTModel": layout,
            f"{_DEIT}:DeiTModel": layout,
            f"{_MAE}:ViTMAEModel": layout,
        },
        blocks={
            f"{_VIT}:ViTLayer": _LAYER,
            f"{_DEIT}:DeiTLayer": _LAYER,
            f"{_MAE}:ViTMAELayer": _LAYER,
        },
        attention={
            f"{_VIT}:ViTAttention": returned_map,
            f"{_DEIT}:DeiTAttention": returned_map,
            f"{_MAE}:ViTMAEAttention": returned_map,
        },
    )
)
