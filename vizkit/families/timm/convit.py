"""ConViT (d'Ascoli et al. 2021): gated positional self-attention (GPSA) blocks over the patches
only, then the class token joins (``local_up_to_layer``) for plain self-attention. A GPSA map is
(1 - sigmoid(λ)) softmax(q kᵀ / sqrt(d)) + sigmoid(λ) softmax(r_pos) (Sec. 3); its content and
positional terms and the gate are read too."""

from __future__ import annotations

from typing import Any

import torch
from timm.models import convit
from torch import Tensor, nn

from ...hooks.family import AttentionContext, BlockSite, Family, FamilyLayout, register_family
from ...hooks.readers import ComputedReader
from ...hooks.sites import captured
from ...hooks.taps import Tap
from .common import SHARED_DROP_PATH, embed_tap, final_norm_taps

__all__ = ["gpsa_content_pattern", "gpsa_gate", "gpsa_position_pattern", "layout"]


def layout(model: convit.ConVit) -> FamilyLayout:
    blocks = [
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0)
        if i < model.local_up_to_layer
        else BlockSite(f"blocks.{i}", prefix_tokens=1)
        for i in range(len(model.blocks))
    ]
    return FamilyLayout("convit", blocks, [embed_tap(prefix_tokens=0), *final_norm_taps(model)])


def gpsa_content_pattern(gpsa: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): softmax(q k^T / sqrt(d)), the content term of a ConViT GPSA map."""
    x = args[0]
    batch, tokens, channels = x.shape
    qk = gpsa.qk(x).reshape(batch, tokens, 2, gpsa.num_heads, channels // gpsa.num_heads)
    q, k = qk.permute(2, 0, 3, 1, 4)
    return ((q @ k.transpose(-2, -1)) * gpsa.scale).softmax(-1)


def gpsa_position_pattern(gpsa: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, N, N): softmax of the learned function of the relative positions, the positional
    term of a ConViT GPSA map (the same for every image)."""
    return gpsa.pos_proj(gpsa.rel_indices[0]).permute(2, 0, 1).softmax(-1)


def gpsa_gate(gpsa: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H,): sigmoid(lambda_h), the weight of the positional term in each head's map."""
    return torch.sigmoid(gpsa.gating_param)


_captured = captured("self")


def _gpsa(path: str, gpsa: nn.Module, context: AttentionContext) -> list[Tap]:
    """The gated map as captured, and the two terms the gate mixes."""
    square = f"{context.tokens} {context.tokens}"
    return [
        *_captured(path, gpsa, context),
        Tap(f"{path}.hook_content_pattern", path, ComputedReader(gpsa_content_pattern),
            kind="content", shape=f"B H {square}", prefix_tokens=context.prefix_tokens,
            grid=context.grid),
        Tap(f"{path}.hook_position_pattern", path, ComputedReader(gpsa_position_pattern),
            kind="position", shape=f"H {square}"),
        Tap(f"{path}.hook_gate", path, ComputedReader(gpsa_gate), kind="gate", shape="H"),
    ]  # fmt: skip


FAMILY = register_family(
    Family(
        "convit",
        "timm",
        models={convit.ConVit: layout},
        blocks={convit.Block: SHARED_DROP_PATH},
        attention={convit.GPSA: _gpsa, convit.MHSA: _captured},
    )
)
