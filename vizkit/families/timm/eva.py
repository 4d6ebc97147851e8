"""EVA / EVA-02 (Fang et al. 2023) and timm's Eva-based models, Perception Encoder among them:
blocks over [prefix, patches]; with rotary position embeddings (RoPE) the map's content term
is also read unrotated."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from timm.layers import AttentionRope
from timm.models import eva
from torch import Tensor, nn

from ...hooks.family import AttentionContext, Family, register_family
from ...hooks.readers import ComputedReader
from ...hooks.sites import captured
from ...hooks.taps import Tap
from .common import POST_NORM, PRE_NORM, flat_layout

__all__ = ["eva_content_pattern", "layout"]


layout = flat_layout("eva")


def eva_content_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): an EVA attention map without its rotary position embedding,
    softmax(q k^T / sqrt(d)) of the unrotated queries and keys: the content term that RoPE
    modulates (the captured ``hook_pattern`` has the rotation)."""
    x = args[0]
    batch, tokens, _ = x.shape
    if attn.qkv is not None:
        bias = None
        if getattr(attn, "q_bias", None) is not None:
            bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        elif attn.qkv.bias is not None:
            bias = attn.qkv.bias
        qkv = torch.nn.functional.linear(x, attn.qkv.weight, bias)
        q, k, _ = qkv.reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    else:
        q, k = (
            proj(x).reshape(batch, tokens, attn.num_heads, -1).transpose(1, 2)
            for proj in (attn.q_proj, attn.k_proj)
        )
    logits = (attn.q_norm(q) * attn.scale) @ attn.k_norm(k).transpose(-2, -1)
    mask = kwargs.get("attn_mask")
    return (logits if mask is None else logits + mask).softmax(-1)


_captured = captured("self")


def _attention(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """The captured map, and with RoPE its content term unrotated."""
    taps = _captured(path, attn, context)
    if taps and getattr(context.model, "rope", None) is not None:
        taps.append(
            Tap(f"{path}.hook_content_pattern", path, ComputedReader(eva_content_pattern),
                kind="content", shape=f"B H {context.tokens} {context.tokens}",
                prefix_tokens=context.prefix_tokens, grid=context.grid)
        )  # fmt: skip
    return taps


_GAMMAS = ("gamma_1", "gamma_2")  # LayerScale as parameters (None when built without it)

FAMILY = register_family(
    Family(
        "eva",
        "timm",
        models={eva.Eva: layout},
        blocks={
            eva.EvaBlock: dataclasses.replace(PRE_NORM, scales=_GAMMAS),
            eva.EvaBlockPostNorm: POST_NORM,
        },
        # AttentionRope: the blocks of timm's Perception Encoder (``vit_pe_*``, Bolya et al.
        # 2025), an EvaAttention with its RoPE given as an argument
        attention={eva.EvaAttention: _attention, AttentionRope: _attention},
    )
)
