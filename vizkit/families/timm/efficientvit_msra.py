"""EfficientViT (MSRA; Liu et al. 2023): cascaded group attention, one head per channel group,
each head's input adding the previous head's output (Eq. 1-2); recomputed from the module's
input, named as captured (kind "unplaced")."""

from __future__ import annotations

from typing import Any

import torch
from timm.models import efficientvit_msra
from torch import Tensor, nn

from ...hooks.family import Family, register_family
from ...hooks.sites import recomputed

__all__ = ["cascaded_group_pattern"]


def cascaded_group_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): every head's map, in head order."""
    x = args[0]
    batch, _, height, width = x.shape
    groups, biases = x.chunk(len(attn.qkvs), dim=1), attn.get_attention_biases(x.device)
    maps, feat = [], groups[0]
    for head, (qkv, dws) in enumerate(zip(attn.qkvs, attn.dws, strict=True)):
        feat = feat + groups[head] if head else feat
        q, k, v = (
            qkv(feat)
            .view(batch, -1, height, width)
            .split([attn.key_dim, attn.key_dim, attn.val_dim], dim=1)
        )
        q, k, v = dws(q).flatten(2), k.flatten(2), v.flatten(2)
        pattern = ((q * attn.scale).transpose(-2, -1) @ k + biases[head]).softmax(-1)
        feat = (v @ pattern.transpose(-2, -1)).view(batch, attn.val_dim, height, width)
        maps.append(pattern)
    return torch.stack(maps, 1)


FAMILY = register_family(
    Family(
        "efficientvit_msra",
        "timm",
        unplaced={
            efficientvit_msra.CascadedGroupAttention: recomputed(
                "unplaced", cascaded_group_pattern, shape="as computed"
            )
        },
    )
)
