"""Rows whose dictionary is known: k-sparse positive combinations of random unit directions,
to check that an autoencoder finds the directions that made its data (the recovery test of
`benchmarks/sae_recovery.py`)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["planted_rows"]


def planted_rows(
    seed: int, rows: int = 20_000, width: int = 32, directions: int = 64, k: int = 3
) -> tuple[Tensor, Tensor]:
    """(rows, width) combinations of ``k`` of the ``directions`` (directions, width) random unit
    directions each, with weights uniform in [0.5, 2.5]; and those directions."""
    generator = torch.Generator().manual_seed(seed)
    dictionary = torch.randn(directions, width, generator=generator)
    dictionary /= dictionary.norm(dim=1, keepdim=True)
    chosen = torch.rand(rows, directions, generator=generator).topk(k, dim=1).indices
    weights = torch.rand(rows, k, generator=generator) * 2 + 0.5
    return torch.zeros(rows, directions).scatter(1, chosen, weights) @ dictionary, dictionary
