"""Per-channel normalization shared by the data sets."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["denormalize", "normalize"]


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """(x - mean) / std per channel of (..., 3, H, W) images in [0, 1]."""
    mean_t = torch.tensor(mean, dtype=torch.float32)[:, None, None]
    std_t = torch.tensor(std, dtype=torch.float32)[:, None, None]
    return (images - mean_t) / std_t


def denormalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """The inverse of `normalize`: x * std + mean per channel of (..., C, H, W) images."""
    mean_t = torch.tensor(mean, dtype=images.dtype, device=images.device)[:, None, None]
    std_t = torch.tensor(std, dtype=images.dtype, device=images.device)[:, None, None]
    return images * std_t + mean_t
