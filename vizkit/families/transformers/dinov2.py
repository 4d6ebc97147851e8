"""Hugging Face transformers' DINOv2 and DINOv2 with registers (Oquab et al. 2023; Darcet et al.
2024, "Vision Transformers Need Registers"): pre-norm blocks ``encoder.layer.{i}`` over
[class, registers, patches], LayerScale ``layer_scale{1,2}.lambda1``, one ``drop_path`` module
closing both branches (its first and second call)."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import embedding_tokens, returned_map

__all__ = ["layout"]

_DINO = "transformers.models.dinov2.modeling_dinov2"
_REG = "transformers.models.dinov2_with_registers.modeling_dinov2_with_registers"


def layout(model: nn.Module) -> FamilyLayout:
    """``Dinov2Model`` / ``Dinov2WithRegistersModel``: embeddings, ``encoder.layer.{i}``,
    ``layernorm``."""
    blocks = [BlockSite(f"encoder.layer.{i}") for i in range(len(model.encoder.layer))]
    extra = [Tap("hook_final_norm", "layernorm", shape="B N C")]
    return FamilyLayout(
        "dinov2", blocks, extra, tokens=embedding_tokens(model.embeddings), reads_class_token=True
    )


_LAYER = ResidualSpec(
    "drop_path", "drop_path", "norm2", scales=("layer_scale1.lambda1", "layer_scale2.lambda1")
)

FAMILY = register_family(
    Family(
        "dinov2",
        "transformers",
        models={f"{_DINO}:Dinov2Model": layout, f"{_REG}:Dinov2WithRegistersModel": layout},
        blocks={f"{_DINO}:Dinov2Layer": _LAYER, f"{_REG}:Dinov2WithRegistersLayer": _LAYER},
        attention={
            f"{_DINO}:Dinov2Attention": returned_map,
            f"{_REG}:Dinov2WithRegistersAttention": returned_map,
        },
    )
)
