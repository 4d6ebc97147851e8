"""Hugging Face transformers' VideoMAE (Tong et al. 2022, "VideoMAE: Masked Autoencoders are
Data-Efficient Learners for Self-Supervised Video Pre-Training"): clips (B, T, C, H, W) cut into
2 x 16 x 16 tubelets (Sec. 3.3), joint space-time attention over T' x gh x gw patch tokens and no
class token; pre-norm blocks ``encoder.layer.{i}``. ``VideoMAEForVideoClassification`` pools
the tokens (``fc_norm`` of their mean). Found inside it or a module of your own."""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.taps import Tap
from .common import returned_map
from .tubelets import tubelet_tokens, tubelet_video

__all__ = ["layout"]

_VIDEOMAE = "transformers.models.videomae.modeling_videomae"


def layout(model: nn.Module) -> FamilyLayout:
    """``VideoMAEModel``: embeddings, ``encoder.layer.{i}``, ``layernorm`` (absent where the
    model pools its tokens)."""
    blocks = [BlockSite(f"encoder.layer.{i}") for i in range(len(model.encoder.layer))]
    extra = [] if model.layernorm is None else [Tap("hook_final_norm", "layernorm", shape="B N C")]
    video = tubelet_video(model.embeddings, model.config.num_frames)
    tokens = tubelet_tokens(model.embeddings, video, prefix=0)
    return FamilyLayout("videomae", blocks, extra, tokens=tokens, reads_class_token=False,
                        video=video)  # fmt: skip


# x + attention(layernorm_before(x)) (its output projection and dropout inside);
# x + output.dropout(output.dense(intermediate(layernorm_after(x))))
_LAYER = ResidualSpec("attention", "output.dropout", "layernorm_after")

FAMILY = register_family(
    Family(
        "videomae",
        "transformers",
        models={f"{_VIDEOMAE}:VideoMAEModel": layout},
        blocks={f"{_VIDEOMAE}:VideoMAELayer": _LAYER},
        attention={f"{_VIDEOMAE}:VideoMAEAttention": returned_map},
    )
)
