"""Hugging Face transformers' CLIP and SigLIP vision towers (``CLIPVisionModel``, also inside
``CLIPModel`` and ``CLIPVisionModelWithProjection``; ``SiglipVisionModel``, also inside
``SiglipModel``): pre-norm blocks ``encoder.layers.{i}`` whose branches end in the attention's
``out_proj`` and the ``mlp``. CLIP's tokens are [class, patches] and its pooled output is the
class token; SigLIP has no class token, and its attention-pooling head (an
``nn.MultiheadAttention`` with a learned probe, `vizkit.families.torch`) is read as a pooling
map (``head.attention.hook_pattern``, (B, H, 1, N))."""

from __future__ import annotations

from torch import nn

from ...hooks.family import (
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    inner_layout,
    projected,
    register_family,
)
from ...hooks.taps import Tap
from .common import embedding_tokens, returned_map

__all__ = ["CLIP_LAYER", "layout"]

_CLIP = "transformers.models.clip.modeling_clip"
_SIGLIP = "transformers.models.siglip.modeling_siglip"


def layout(model: nn.Module) -> FamilyLayout:
    blocks = [BlockSite(f"encoder.layers.{i}") for i in range(len(model.encoder.layers))]
    tokens = embedding_tokens(model.embeddings)
    class_token = getattr(model.embeddings, "class_embedding", None) is not None
    # SigLIP normalizes every token; CLIP's post_layernorm sees the pooled class token only
    extra = [] if class_token else [Tap("hook_final_norm", "post_layernorm", shape="B N C")]
    return FamilyLayout(
        "clip" if class_token else "siglip", blocks, extra, tokens=tokens,
        reads_class_token=class_token, readout=_pooled(model) if class_token else None,
    )  # fmt: skip


def _pooled(model: nn.Module):
    """CLIP's pooled output on the last block's tokens: the final norm of the class token."""

    def readout(tokens):
        return model.post_layernorm(tokens[:, 0])

    return readout


def _with_projection(model: nn.Module) -> FamilyLayout | None:
    """``CLIPVisionModelWithProjection``: its vision model's layout, read out through its
    ``visual_projection`` (its image embedding)."""
    return projected(inner_layout(model), model.visual_projection)


# x + self_attn(layer_norm1(x)) (ending in out_proj); x + mlp(layer_norm2(x))
CLIP_LAYER = ResidualSpec("self_attn.out_proj", "mlp", "layer_norm2")

FAMILY = register_family(
    Family(
        "clip",
        "transformers",
        models={
            f"{_CLIP}:CLIPVisionModel": layout,
            f"{_CLIP}:CLIPVisionModelWithProjection": _with_projection,
            f"{_SIGLIP}:SiglipVisionModel": layout,
        },
        blocks={
            f"{_CLIP}:CLIPEncoderLayer": CLIP_LAYER,
            f"{_SIGLIP}:SiglipEncoderLayer": CLIP_LAYER,
        },
        attention={
            f"{_CLIP}:CLIPAttention": returned_map,
            f"{_SIGLIP}:SiglipAttention": returned_map,
        },
    )
)
