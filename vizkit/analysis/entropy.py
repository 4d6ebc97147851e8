"""Normalized entropy of attention distributions."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["normalized_entropy"]


def normalized_entropy(pattern: Tensor, dim: int = -1) -> Tensor:
    """Entropy of each distribution along ``dim`` divided by log(K): 1 = uniform over the K keys,
    0 = all mass on one key. Computed in float64, with 0 log 0 = 0.

    Args:
        pattern: probabilities (..., K, ...) that sum to 1 along ``dim``, e.g. (B, H, N, N).

    Returns:
        (...) with ``dim`` removed, in ``pattern``'s dtype.
    """
    keys = pattern.shape[dim]
    if keys < 2:
        raise ValueError(
            f"Entropy over {keys} key(s) is undefined; dim {dim} of shape "
            f"{tuple(pattern.shape)} must have at least 2 entries."
        )
    p = pattern.double()
    if (p < -1e-6).any() or not torch.allclose(
        p.sum(dim), torch.ones((), dtype=p.dtype), atol=1e-3
    ):
        raise ValueError(
            "normalized_entropy needs probabilities (non-negative, summing to 1 along "
            f"dim {dim}); mixed talking-heads maps are not. Use attn.hook_pattern."
        )
    h = -torch.special.xlogy(p, p).sum(dim)
    return (h / math.log(keys)).to(pattern.dtype)
