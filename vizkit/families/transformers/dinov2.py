"""Hugging Face transformers' DINOv2 and DINOv2 with registers (Oquab et al. 2023; Darcet et al.
2024, "Vision Transformers Need Registers"): pre-norm blocks ``encoder.layer.{i}`` over
[class, registers, patches], LayerScale ``layer_scale{1,2}.lambda1``, one ``drop_path`` module
closing both branches (its first and second call)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import embedding_tokens, returned_map

__all__ = ["DINO_LAYER", "backbone_layout", "dino_layout", "layout"]

_DINO = "transformers.models.dinov2.modeling_dinov2"
_REG = "transformers.models.dinov2_with_registers.modeling_dinov2_with_registers"


def dino_layout(
    family: str, stack: str, norm: str, reads_class_token: bool = True
) -> Callable[[nn.Module], FamilyLayout]:
    """The layout of a DINO-style model named ``family``: embeddings, blocks ``{stack}.{i}``
    (``stack`` a module path holding them in order), final norm ``norm``; whether what reads
    it reads the class token (a classifier) or the patches (a dense decoder)."""

    def layout(model: nn.Module) -> FamilyLayout:
        count = len(model.get_submodule(stack))
        blocks = [BlockSite(f"{stack}.{i}") for i in range(count)]
        extra = [Tap("hook_final_norm", norm, shape="B N C")]
        tokens = embedding_tokens(model.embeddings)
        return FamilyLayout(
            family, blocks, extra, tokens=tokens, reads_class_token=reads_class_token
        )

    return layout


# ``Dinov2Model`` / ``Dinov2WithRegistersModel``: embeddings, ``encoder.layer.{i}``, ``layernorm``
layout = dino_layout("dinov2", "encoder.layer", "layernorm")
# ``Dinov2Backbone``: the same blocks, its patches read by a dense decoder (Depth Anything, Yang
# et al. 2024, "Depth Anything: Unleashing the Power of Large-Scale Unlabeled Data": the DPT
# decoder on four of its layers)
backbone_layout = dino_layout("dinov2", "encoder.layer", "layernorm", reads_class_token=False)

# x + drop_path(ls1(attention(norm1(x)))); x + drop_path(ls2(mlp(norm2(x))))
DINO_LAYER = ResidualSpec(
    "drop_path", "drop_path", "norm2", scales=("layer_scale1.lambda1", "layer_scale2.lambda1")
)

FAMILY = register_family(
    Family(
        "dinov2",
        "transformers",
        models={
            f"{_DINO}:Dinov2Model": layout,
            f"{_REG}:Dinov2WithRegistersModel": layout,
            f"{_DINO}:Dinov2Backbone": backbone_layout,
        },
        blocks={f"{_DINO}:Dinov2Layer": DINO_LAYER, f"{_REG}:Dinov2WithRegistersLayer": DINO_LAYER},
        attention={
            f"{_DINO}:Dinov2Attention": returned_map,
            f"{_REG}:Dinov2WithRegistersAttention": returned_map,
        },
    )
)
