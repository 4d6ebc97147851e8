"""Localization against ground-truth object masks (e.g. the Shapes data).

Each metric upsamples the saliency maps to the mask's pixels (bilinear) and returns one value per
image (B,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..analysis.saliency_result import SaliencyResult, check_maps_fit, rank_descending

__all__ = ["energy_in_mask", "pixel_maps", "pointing_game", "top_iou"]


def pixel_maps(saliency: SaliencyResult | Tensor, masks: Tensor) -> Tensor:
    """Saliency (B, h, w) resized to the masks (B, H, W), float32, after checking the shapes."""
    maps = saliency.maps if isinstance(saliency, SaliencyResult) else saliency
    if masks.ndim != 3 or masks.dtype != torch.bool:
        raise ValueError(f"masks must be bool (B, H, W); got {masks.dtype} {tuple(masks.shape)}.")
    check_maps_fit(maps, len(masks), tuple(masks.shape[-2:]))
    maps = maps.float().to(masks.device)
    if tuple(maps.shape[-2:]) == tuple(masks.shape[-2:]):
        return maps
    return F.interpolate(maps[:, None], size=tuple(masks.shape[-2:]), mode="bilinear")[:, 0]


def pointing_game(saliency: SaliencyResult | Tensor, masks: Tensor, tolerance: int = 0) -> Tensor:
    """Hit (1.0) when the most salient pixel lies on the object, or within ``tolerance`` pixels
    of it (Zhang et al. 2018 use 15 px at 224); else 0.0. (B,)"""
    maps = pixel_maps(saliency, masks)
    target = masks.float()[:, None]
    if tolerance:
        target = F.max_pool2d(target, 2 * tolerance + 1, stride=1, padding=tolerance)
    peak = maps.flatten(1).argmax(1)
    return target.flatten(1).gather(1, peak[:, None])[:, 0]


def energy_in_mask(saliency: SaliencyResult | Tensor, masks: Tensor) -> Tensor:
    """Share of the positive saliency that falls on the object (energy-based pointing game,
    Wang et al. 2020, Score-CAM). (B,); 0 for a map without positive values."""
    maps = pixel_maps(saliency, masks).clamp_min(0)
    inside = (maps * masks).flatten(1).sum(1)
    return inside / maps.flatten(1).sum(1).clamp_min(1e-12)


def top_iou(
    saliency: SaliencyResult | Tensor, masks: Tensor, fraction: float | None = None
) -> Tensor:
    """IoU between the top ``fraction`` of pixels by saliency and the object mask. (B,)

    Args:
        fraction: share of pixels kept, in (0, 1]; None uses each mask's own area share, so a
            perfect map scores 1.
    """
    maps = pixel_maps(saliency, masks).flatten(1)
    flat_masks = masks.flatten(1)
    if fraction is None:
        counts = flat_masks.sum(1).clamp_min(1)
    elif 0 < fraction <= 1:
        counts = torch.full((len(maps),), max(1, round(fraction * maps.shape[1])))
    else:
        raise ValueError(f"fraction must be in (0, 1] or None; got {fraction}.")
    top = rank_descending(maps) < counts.to(maps.device)[:, None]
    intersection = (top & flat_masks).sum(1).float()
    union = (top | flat_masks).sum(1).float().clamp_min(1)
    return intersection / union
