"""LowFormer and CPUBone: attention over a strided convolutional projection of a (B, C, h, w)
map; maps recomputed from the module's input, named as captured (kind "unplaced")."""

from __future__ import annotations

from typing import Any

import torch
from timm.models import cpubone, lowformer
from torch import Tensor, nn

from ...hooks.family import Family, register_family
from ...hooks.sites import recomputed

__all__ = ["conv_attention_pattern"]


def conv_attention_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, n, n): attention over the projection's n = h' w' positions."""
    x = args[0]
    if getattr(attn, "small_kernels", False) and getattr(attn, "att_stride", 1) > 1:
        stride = attn.att_stride  # CPUBone pads odd sizes before projecting, as its forward
        x = torch.nn.functional.pad(x, (0, (-x.shape[-1]) % stride, 0, (-x.shape[-2]) % stride))
    projected = attn.pwise(attn.conv_proj(x))
    batch, _, height, width = projected.shape
    qkv = projected.reshape(batch, attn.num_heads, attn.num_keys * attn.head_dim, height * width)
    q, k, _ = qkv.permute(0, 1, 3, 2).chunk(3, dim=3)
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)


_SITE = recomputed("unplaced", conv_attention_pattern, shape="as computed")

FAMILY = register_family(
    Family(
        "lowformer",
        "timm",
        unplaced={lowformer.ConvAttention: _SITE, cpubone.ConvAttention: _SITE},
    )
)
