"""Hugging Face transformers' DPT (Ranftl et al. 2021, "Vision Transformers for Dense
Prediction"): a ViT encoder (pre-norm blocks ``encoder.layer.{i}`` over [class, patches]) whose
reassembled tokens a convolutional decoder turns into depth (``DPTForDepthEstimation``) or
per-pixel class logits (``DPTForSemanticSegmentation``). Explain their outputs with the dense
targets of `vizkit.targets`. The hybrid DPT (a BiT backbone before the ViT) is not covered."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import embedding_tokens, returned_map

__all__ = ["layout"]

_DPT = "transformers.models.dpt.modeling_dpt"


def layout(model: nn.Module) -> FamilyLayout | None:
    """``DPTModel``: embeddings, ``encoder.layer.{i}``, ``layernorm``; None for the hybrid
    DPT, whose patches come from a convolutional backbone."""
    if getattr(model.config, "is_hybrid", False):
        return None
    blocks = [BlockSite(f"encoder.layer.{i}") for i in range(len(model.encoder.layer))]
    extra = [Tap("hook_final_norm", "layernorm", shape="B N C")]
    return FamilyLayout("dpt", blocks, extra, tokens=embedding_tokens(model.embeddings))


# x + attention(layernorm_before(x)) (its output projection inside);
# x + output.dropout(output.dense(intermediate(layernorm_after(x))))
_LAYER = ResidualSpec("attention", "output.dropout", "layernorm_after")

FAMILY = register_family(
    Family(
        "dpt",
        "transformers",
        models={f"{_DPT}:DPTModel": layout},
        blocks={f"{_DPT}:DPTViTLayer": _LAYER},
        attention={f"{_DPT}:DPTViTAttention": returned_map},
    )
)
