"""How alike two batches of saliency maps are, per image, as the sanity checks compare them
(Adebayo et al., NeurIPS 2018, "Sanity Checks for Saliency Maps", Sec. 3): Spearman rank
correlation of the maps (of their absolute values, and signed), the structural similarity
index (SSIM; Wang et al. 2004) of the maps scaled to [0, 1], and the Pearson correlation of
their histograms of oriented gradients (HOG; Dalal and Triggs 2005)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..analysis.saliency_result import min_max

__all__ = ["SIMILARITIES", "hog", "hog_similarity", "pearson", "spearman", "ssim"]


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


def pearson(a: Tensor, b: Tensor) -> Tensor:
    """(B,) Pearson correlation of the rows of ``a`` and ``b`` (B, n); NaN for a constant
    row."""
    a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    denominator = a.norm(dim=-1) * b.norm(dim=-1)
    correlation = (a * b).sum(-1) / denominator.clamp_min(1e-300)
    return correlation.masked_fill(denominator == 0, float("nan"))


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """(B,) Spearman rank correlation of maps ``a`` and ``b`` (B, h, w), per image; NaN where
    a map is constant (its ranks carry no order)."""
    return pearson(_ranks(a.flatten(1)), _ranks(b.flatten(1)))


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


def hog(maps: Tensor, cell: int, block: int = 3, bins: int = 9) -> Tensor:
    """(B, F) HOG features of maps (B, h, w) as scikit-image's ``hog`` computes them with
    ``pixels_per_cell=(cell, cell)``, ``cells_per_block=(block, block)``, ``orientations=bins``
    and L2-Hys block norms: central-difference gradients, unsigned orientations binned by
    magnitude over non-overlapping cells, blocks of cells one cell apart, each normalized."""
    x = maps.double()
    rows, cols = torch.zeros_like(x), torch.zeros_like(x)
    rows[:, 1:-1] = x[:, 2:] - x[:, :-2]
    cols[:, :, 1:-1] = x[:, :, 2:] - x[:, :, :-2]
    magnitude = torch.hypot(rows, cols)
    orientation = torch.rad2deg(torch.atan2(rows, cols)) % 180
    n_rows, n_cols = x.shape[-2] // cell, x.shape[-1] // cell
    magnitude = magnitude[:, : n_rows * cell, : n_cols * cell]
    which = (orientation[:, : n_rows * cell, : n_cols * cell] / (180 / bins)).floor().long()
    which = which.clamp(0, bins - 1)
    cells = (torch.arange(n_rows * cell, device=x.device) // cell)[:, None] * n_cols + (
        torch.arange(n_cols * cell, device=x.device) // cell
    )[None, :]
    index = (cells[None] * bins + which).flatten(1)
    histogram = torch.zeros(len(x), n_rows * n_cols * bins, dtype=x.dtype, device=x.device)
    histogram.scatter_add_(1, index, magnitude.flatten(1))
    histogram = (histogram / cell**2).view(len(x), n_rows, n_cols, bins)
    blocks = histogram.unfold(1, block, 1).unfold(2, block, 1)  # (B, nbr, nbc, bins, b, b)
    blocks = blocks.permute(0, 1, 2, 4, 5, 3).flatten(3)  # cells row-major, then bins
    eps = 1e-5
    blocks = blocks / (blocks.pow(2).sum(-1, keepdim=True) + eps**2).sqrt()
    blocks = blocks.clamp_max(0.2)
    blocks = blocks / (blocks.pow(2).sum(-1, keepdim=True) + eps**2).sqrt()
    return blocks.flatten(1)


def hog_similarity(a: Tensor, b: Tensor) -> Tensor:
    """(B,) Pearson correlation of the HOG features of maps ``a`` and ``b`` (B, h, w), each
    scaled to [0, 1]: cells of min(8, side // 4) pixels (8 as scikit-image's default, fewer on
    a patch grid, so that a map has at least 4 x 4 cells), blocks of 3 x 3 cells. NaN where a
    map's features are constant."""
    cell = max(1, min(8, min(a.shape[-2:]) // 4))
    return pearson(*(hog(min_max(m.double()), cell) for m in (a, b)))


# name -> (B,) similarity of two (B, h, w) map batches
SIMILARITIES = {
    "spearman_abs": lambda a, b: spearman(a.abs(), b.abs()),
    "spearman": spearman,
    "ssim": ssim,
    "hog": hog_similarity,
}
