"""EfficientFormer and EfficientFormer V2 (Li et al. 2022): attention on the last stages of a
convolutional network. vizkit has no token layout for them, so their maps are named as captured
(kind "unplaced"): V1's recomputed from the module's input, V2's read before its second
talking-heads mix."""

from __future__ import annotations

from typing import Any

from timm.models import efficientformer, efficientformer_v2
from torch import Tensor, nn

from ...hooks.family import AttentionContext, Family, register_family
from ...hooks.readers import InputReader
from ...hooks.sites import recomputed
from ...hooks.taps import Tap

__all__ = ["biased_attention_pattern"]


def biased_attention_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): softmax(q k^T scale + learned attention biases) of EfficientFormer's and
    TinyViT's (after its input norm) attention, as their forwards compute it."""
    x = args[0]
    x = attn.norm(x) if hasattr(attn, "norm") else x
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).view(batch, tokens, attn.num_heads, -1).transpose(1, 2)
    q, k = qkv[..., : attn.key_dim], qkv[..., attn.key_dim : 2 * attn.key_dim]
    logits = (q @ k.transpose(-2, -1)) * attn.scale
    return (logits + attn.get_attention_biases(x.device)).softmax(-1)


def _talking_heads_softmax(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """V2's softmax map, at the input of its second talking-heads mix."""
    return [Tap(f"{path}.hook_pattern", f"{path}.talking_head2", InputReader(), kind="unplaced",
                shape="B H N N")]  # fmt: skip


FAMILY = register_family(
    Family(
        "efficientformer",
        "timm",
        unplaced={
            efficientformer.Attention: recomputed(
                "unplaced", biased_attention_pattern, shape="as computed"
            ),
            efficientformer_v2.Attention2d: _talking_heads_softmax,
        },
    )
)
