"""Hugging Face transformers' V-JEPA 2 (Assran et al. 2025, "V-JEPA 2: Self-Supervised Video
Models Enable Understanding, Prediction and Planning"): clips (B, T, C, H, W) cut into
2 x 16 x 16 tubelets by a Conv3d, pre-norm blocks ``encoder.layer.{i}`` with 3-D rotary
positions over T' x gh x gw patch tokens (no class token; its predictor is not read).
``VJEPA2ForVideoClassification`` pools them with an attentive pooler: self-attention layers over
the same tokens (blocks of its own here, after the encoder's) and a learned query's
cross-attention (``pooler.cross_attention_layer.cross_attn.hook_pattern``, (B, H, 1, N)), read
as a pooling map so rollout follows it."""

from __future__ import annotations

from torch import nn

from ...hooks.family import (
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    register_family,
)
from ...hooks.layout import TokenLayout
from ...hooks.taps import Tap
from ...hooks.video import VideoInput
from .common import returned_map, returned_pooling_map

__all__ = ["classifier_layout", "layout"]

_VJEPA2 = "transformers.models.vjepa2.modeling_vjepa2"


def _video(model: nn.Module) -> tuple[VideoInput, TokenLayout]:
    """The clips a ``VJEPA2Model`` takes (its config's frames and crop size) and their tokens."""
    config, conv = model.config, model.encoder.embeddings.patch_embeddings.proj
    video = VideoInput(int(config.frames_per_clip), conv.kernel_size[0], conv.in_channels,
                       (int(config.crop_size), int(config.crop_size)))  # fmt: skip
    _, ph, pw = conv.kernel_size
    tokens = TokenLayout(0, (video.size[0] // ph, video.size[1] // pw), False,
                         frames=video.token_frames)  # fmt: skip
    return video, tokens


def layout(model: nn.Module) -> FamilyLayout:
    """``VJEPA2Model``: embeddings, ``encoder.layer.{i}``, ``encoder.layernorm``."""
    video, tokens = _video(model)
    blocks = [BlockSite(f"encoder.layer.{i}") for i in range(len(model.encoder.layer))]
    extra = [Tap("hook_final_norm", "encoder.layernorm", shape="B N C")]
    return FamilyLayout("vjepa2", blocks, extra, tokens=lambda size: tokens,
                        reads_class_token=False, video=video)  # fmt: skip


def classifier_layout(model: nn.Module) -> FamilyLayout:
    """``VJEPA2ForVideoClassification``: the encoder's blocks, then its pooler's self-attention
    layers (over the same tokens), then the pooler's cross-attention (outside the blocks)."""
    video, tokens = _video(model.vjepa2)
    encoder = [
        BlockSite(f"vjepa2.encoder.layer.{i}") for i in range(len(model.vjepa2.encoder.layer))
    ]
    pooler = [BlockSite(f"pooler.self_attention_layers.{i}")
              for i in range(len(model.pooler.self_attention_layers))]  # fmt: skip
    return FamilyLayout("vjepa2", encoder + pooler, tokens=lambda size: tokens,
                        reads_class_token=False, video=video)  # fmt: skip


# x + drop_path(attention(norm1(x))); x + drop_path(mlp(norm2(x))); (x, weights) returned
_LAYER = ResidualSpec("drop_path", "drop_path", "norm2", output_item=0)
# x + self_attn(layer_norm1(x)) (ending in out_proj); x + mlp(layer_norm2(x)); (x, weights)
_POOLER_LAYER = ResidualSpec("self_attn.out_proj", "mlp", "layer_norm2", output_item=0)

FAMILY = register_family(
    Family(
        "vjepa2",
        "transformers",
        models={
            f"{_VJEPA2}:VJEPA2Model": layout,
            f"{_VJEPA2}:VJEPA2ForVideoClassification": classifier_layout,
        },
        blocks={
            f"{_VJEPA2}:VJEPA2Layer": _LAYER,
            f"{_VJEPA2}:VJEPA2PoolerSelfAttentionLayer": _POOLER_LAYER,
        },
        attention={
            f"{_VJEPA2}:VJEPA2RopeAttention": returned_map,
            f"{_VJEPA2}:VJEPA2PoolerSelfAttention": returned_map,
            f"{_VJEPA2}:VJEPA2PoolerCrossAttention": returned_pooling_map,
        },
        outside_blocks=(f"{_VJEPA2}:VJEPA2PoolerCrossAttention",),
    )
)
