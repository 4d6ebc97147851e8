"""SHViT (Yun & Ro 2024): single-head attention over the first ``pdim`` channels of a
(B, C, h, w) map; recomputed from the module's input, named as captured (kind "unplaced")."""

from __future__ import annotations

from typing import Any

import torch
from timm.models import shvit
from torch import Tensor, nn

from ...hooks.family import Family, register_family
from ...hooks.sites import recomputed

__all__ = ["single_head_pattern"]


def single_head_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, 1, N, N): the one head's map."""
    x1 = attn.pre_norm(args[0][:, : attn.pdim])
    q, k, _ = torch.split(attn.qkv(x1), [attn.qk_dim, attn.qk_dim, attn.pdim], dim=1)
    return ((q.flatten(2).transpose(-2, -1) @ k.flatten(2)) * attn.scale).softmax(-1)[:, None]


FAMILY = register_family(
    Family(
        "shvit",
        "timm",
        unplaced={shvit.SHSA: recomputed("unplaced", single_head_pattern, shape="as computed")},
    )
)
