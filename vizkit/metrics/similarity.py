"""How alike two batches of saliency maps are, per image, as the sanity checks compare them
(Adebayo et al., NeurIPS 2018, "Sanity Checks for Saliency Maps", Sec. 3): Spearman rank
correlation of the maps (of their absolute values, and signed) and the structural similarity
index (SSIM; Wang et al. 2004) of the maps scaled to [0, 1]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..analysis.saliency_result import min_max

__all__ = ["SIMILARITIES", "spearman", "ssim"]


def _ranks(values: Tensor) -> Tensor:
    """Ranks 1..n along the last axis (B, n), ties given their mean rank."""
    order = values.argsort(-1)
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks.scatter_(-1, order, torch.arange(1, values.shape[-1] + 1, dtype=torch.float64,
                                           device=values.device).expand_as(values))  # fmt: skip
    for row in range(len(values)):  # ties: rare in float maps, exact in random ones
        distinct, inverse, counts = values[row].unique(return_inverse=True, return_counts=True)
        if len(distinct) < values.shape[-1]:
            sums = torch.zeros(len(distinct), dtype=torch.float64, device=values.device)
            sums.index_add_(0, inverse, ranks[row])
            ranks[row] = (sums / counts)[inverse]
    return ranks


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """(B,) Spearman rank correlation of maps ``a`` and ``b`` (B, h, w), per image; NaN where
    a map is constant (its ranks carry no order)."""
    ra, rb = (_ranks(m.flatten(1)) for m in (a, b))
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    denominator = (ra.norm(dim=-1) * rb.norm(dim=-1)).clamp_min(1e-300)
    correlation = (ra * rb).sum(-1) / denominator
    constant = (ra.abs().amax(-1) == 0) | (rb.abs().amax(-1) == 0)
    return correlation.masked_fill(constant, float("nan"))


def ssim(a: Tensor, b: Tensor, window: int = 7) -> Tensor:
    """(B,) mean structural similarity of maps ``a`` and ``b`` (B, h, w), each min-max scaled
    to [0, 1] first: a uniform ``window`` (shrunk to the largest odd size that fits), the
    constants K1 = 0.01, K2 = 0.03 and the sample covariance, over the windows that fit
    (scikit-image's ``structural_similarity`` with its defaults)."""
    window = min(window, a.shape[-1], a.shape[-2])
    window -= 1 - window % 2
    x, y = (min_max(m.double())[:, None] for m in (a, b))
    mean = lambda t: F.avg_pool2d(t, window, stride=1)  # noqa: E731
    correction = window**2 / (window**2 - 1) if window > 1 else 1.0
    mx, my = mean(x), mean(y)
    vx = (mean(x * x) - mx * mx) * correction
    vy = (mean(y * y) - my * my) * correction
    cov = (mean(x * y) - mx * my) * correction
    c1, c2 = 0.01**2, 0.03**2
    index = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return index.flatten(1).mean(-1)


# name -> (B,) similarity of two (B, h, w) map batches
SIMILARITIES = {
    "spearman_abs": lambda a, b: spearman(a.abs(), b.abs()),
    "spearman": spearman,
    "ssim": ssim,
}
