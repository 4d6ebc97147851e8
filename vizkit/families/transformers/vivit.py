"""Hugging Face transformers' ViViT (Arnab et al. 2021, "ViViT: A Video Vision Transformer"),
Model 1, spatio-temporal attention (Sec. 3.3): clips (B, T, C, H, W) cut into tubelets
(Sec. 3.2, "tubelet embedding"), a class token, then joint attention over [class, T' x gh x gw
patches]; pre-norm blocks ``layers.{i}`` (``encoder.layer.{i}`` before transformers 5.18), one
``dropout`` module closing both branches. ``VivitForVideoClassification`` reads the class token.
Found inside it or a module of your own."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import returned_map
from .tubelets import tubelet_tokens, tubelet_video

__all__ = ["layout"]

_VIVIT = "transformers.models.vivit.modeling_vivit"


def layout(model: nn.Module) -> FamilyLayout:
    """``VivitModel``: embeddings, its blocks, ``layernorm``."""
    stack = "layers" if hasattr(model, "layers") else "encoder.layer"
    count = len(model.get_submodule(stack))
    blocks = [BlockSite(f"{stack}.{i}") for i in range(count)]
    extra = [Tap("hook_final_norm", "layernorm", shape="B N C")]
    video = tubelet_video(model.embeddings, model.config.num_frames)
    tokens = tubelet_tokens(model.embeddings, video, prefix=1)
    return FamilyLayout("vivit", blocks, extra, tokens=tokens, reads_class_token=True,
                        video=video)  # fmt: skip


# x + dropout(attention(layernorm_before(x))); x + dropout(mlp(layernorm_after(x)))
_LAYER = ResidualSpec("dropout", "dropout", "layernorm_after")

FAMILY = register_family(
    Family(
        "vivit",
        "transformers",
        models={f"{_VIVIT}:VivitModel": layout},
        blocks={f"{_VIVIT}:VivitLayer": _LAYER},
        attention={f"{_VIVIT}:VivitAttention": returned_map},
    )
)
