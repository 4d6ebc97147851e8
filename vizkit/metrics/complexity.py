"""How concentrated a saliency map is, from the map alone: Sparseness, the Gini index of |map|
(Chalasani et al. 2020, "Concise Explanations of Neural Networks using Adversarial Training",
higher: sparser), and Complexity, the entropy of each pixel's share of the total |map| (Bhatt et
al. 2020, "Evaluating and Aggregating Feature-based Model Explanations", lower: simpler). (B,)
per image, on the maps as given (no resizing); a video's maps (B, F, h, w) over all their
cells."""

from __future__ import annotations

import torch
from torch import Tensor

from ..analysis.saliency_result import SaliencyResult
from ..hooks.inputs import check_maps, check_values_finite
from .registry import ScoredBatch, metric

__all__ = ["complexity", "sparseness"]


def _magnitudes(saliency: SaliencyResult | Tensor) -> Tensor:
    """|maps| flattened (B, n) in float64, after checking them: (B, h, w) or a clip's
    (B, F, h, w), finite, no map all zero (its shares are undefined)."""
    video = isinstance(saliency, SaliencyResult) and saliency.frames is not None
    maps = saliency.maps if isinstance(saliency, SaliencyResult) else saliency
    clip = video or (isinstance(maps, Tensor) and maps.ndim == 4 and maps.shape[1] > 1)
    axes = "(B, F, h, w)" if clip else "(B, h, w), or a clip's (B, F, h, w)"
    check_maps("saliency maps", maps, axes, ndim=4 if clip else 3)
    check_values_finite("The saliency maps", maps)
    flat = maps.detach().double().abs().flatten(1)
    empty = flat.amax(1) == 0
    if bool(empty.any()):
        raise ValueError(
            f"The saliency maps of samples {empty.nonzero()[:, 0].tolist()[:10]} are all zero: "
            "a share of nothing is undefined. Drop those samples."
        )
    return flat


def sparseness(saliency: SaliencyResult | Tensor) -> Tensor:
    """(B,) Gini index of |map|: sum_i (2i - n - 1) a_(i) / (n sum_i a_i), a sorted ascending;
    0 for a uniform map, (n - 1) / n for a single pixel."""
    values = _magnitudes(saliency).sort(1).values
    n = values.shape[1]
    i = torch.arange(1, n + 1, dtype=values.dtype, device=values.device)
    return ((2 * i - n - 1) * values).sum(1) / (n * values.sum(1))


def complexity(saliency: SaliencyResult | Tensor) -> Tensor:
    """(B,) entropy -sum_i p_i log p_i of the shares p_i = |a_i| / sum_j |a_j| (0 log 0 = 0);
    log n for a uniform map, 0 for a single pixel."""
    values = _magnitudes(saliency)
    shares = values / values.sum(1, keepdim=True)
    return -(shares * shares.clamp_min(1e-300).log()).sum(1)


@metric("sparseness", videos=True, higher=True,
        summary="Gini index of the map's magnitudes (Chalasani et al. 2020)")  # fmt: skip
def _sparseness(batch: ScoredBatch) -> Tensor:
    return sparseness(batch.result)


@metric("complexity", videos=True, higher=False,
        summary="entropy of the map's magnitude shares (Bhatt et al. 2020)")  # fmt: skip
def _complexity(batch: ScoredBatch) -> Tensor:
    return complexity(batch.result)
