"""Hugging Face transformers' AIMv2 vision encoder (Fini et al. 2025, "Multimodal Autoregressive
Pre-training of Large Vision Encoders"; ``Aimv2VisionModel``, also inside ``Aimv2Model``):
pre-norm blocks ``encoder.layers.{i}`` (RMSNorm) over the patches alone, whose branches end in
the attention's ``out_proj`` and the ``ffn``; its attention-pooling head's map over the last
block's tokens is computed from its learned query (``head.hook_pattern``, (B, H, 1, N))."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ...hooks.family import (
    AttentionContext,
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    register_family,
)
from ...hooks.layout import TokenLayout
from ...hooks.readers import ComputedReader
from ...hooks.taps import Tap
from .common import returned_map

__all__ = ["layout"]

_AIM = "transformers.models.aimv2.modeling_aimv2"


def layout(model: nn.Module) -> FamilyLayout:
    """``Aimv2VisionModel``: embeddings (a patch convolution), ``encoder.layers.{i}``,
    ``rms_norm``."""
    blocks = [BlockSite(f"encoder.layers.{i}") for i in range(len(model.encoder.layers))]
    ph, pw = model.embeddings.patch_embed.kernel_size

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, (image_size[0] // ph, image_size[1] // pw), False)

    extra = [Tap("hook_final_norm", "rms_norm", shape="B N C")]
    return FamilyLayout("aimv2", blocks, extra, tokens=tokens, reads_class_token=False)


def pooling_pattern(head: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, 1, N): the pooling head's attention, softmax(c k^T / sqrt(d)) of its learned
    query ``cls_token`` (not projected) over the keys of the last block's tokens, as its
    scaled-dot-product attention computes it."""
    tokens = args[0] if args else kwargs["hidden_states"]
    batch, count, width = tokens.shape
    heads = head.num_heads
    keys = head.k_proj(tokens).reshape(batch, count, heads, width // heads).transpose(1, 2)
    query = head.cls_token.reshape(1, heads, 1, width // heads)
    return (query @ keys.transpose(-2, -1) * (width // heads) ** -0.5).softmax(-1)


def _pooling(path: str, head: nn.Module, context: AttentionContext) -> list[Tap]:
    return [
        Tap(f"{path}.hook_pattern", path, ComputedReader(pooling_pattern), kind="pool",
            shape="B H 1 Np", prefix_tokens=0, grid=context.grid)
    ]  # fmt: skip


# x + attention(rms_norm1(x)) (ending in out_proj); x + ffn(rms_norm2(x))
_LAYER = ResidualSpec("attention.out_proj", "ffn", "rms_norm2")

FAMILY = register_family(
    Family(
        "aimv2",
        "transformers",
        models={f"{_AIM}:Aimv2VisionModel": layout},
        blocks={f"{_AIM}:Aimv2EncoderLayer": _LAYER},
        attention={
            f"{_AIM}:Aimv2Attention": returned_map,
            f"{_AIM}:Aimv2AttentionPoolingHead": _pooling,
        },
        outside_blocks=(f"{_AIM}:Aimv2AttentionPoolingHead",),
    )
)
