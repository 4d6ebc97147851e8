"""The geometric median of a set of rows (Weiszfeld's algorithm), where a sparse autoencoder's
decoder bias starts (Bricken et al. 2023, "Towards Monosemanticity", training details: the
decoder bias is initialized at the geometric median of the data)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["geometric_median"]


def geometric_median(points: Tensor, iterations: int = 200, tolerance: float = 1e-7) -> Tensor:
    """(width,) the point minimizing the summed Euclidean distance to ``points`` (n, width),
    by Weiszfeld's iteration from the mean, in float64."""
    points = points.double()
    median = points.mean(0)
    for _ in range(iterations):
        distances = (points - median).norm(dim=1)
        if bool((distances == 0).any()):  # on a data point: Weiszfeld's step is undefined
            distances = distances.clamp_min(torch.finfo(points.dtype).eps)
        weights = 1.0 / distances
        new = (weights[:, None] * points).sum(0) / weights.sum()
        moved = float((new - median).norm())
        median = new
        if moved <= tolerance * max(float(median.norm()), 1.0):
            break
    return median.float()
