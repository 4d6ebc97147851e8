"""Localization against ground-truth object masks (e.g. the Shapes data).

Each metric upsamples the saliency maps to the mask's pixels (bilinear) and returns one value per
image (B,). Masks are boolean (or 0/1) (B, H, W), each with at least one object pixel; maps with
NaN / Inf values are refused (see `vizkit.analysis.saliency_result.saliency_maps`).

A video model's maps (B, F, h, w) are scored against masks of every frame of the clips,
(B, T, H, W): a token frame's map stands for each frame of its tubelet, each frame's map is
upsampled on its own, and the scores read the clip's T x H x W pixels as one map (the pointing
game's peak is the clip's, its tolerance spatial, within the peak's frame).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..analysis.saliency_result import (
    SaliencyResult,
    frame_maps,
    rank_descending,
    saliency_maps,
)
from ..hooks.inputs import check_count, check_maps, check_number, check_values_finite
from .registry import ScoredBatch, metric

__all__ = [
    "check_masks",
    "mask_shape",
    "energy_in_mask",
    "pixel_maps",
    "pointing_game",
    "relevance_mass_accuracy",
    "relevance_rank_accuracy",
    "top_iou",
]


def check_masks(masks: Tensor) -> Tensor:
    """``masks`` (B, H, W) as bool, after checking them: a bool or 0/1 (integer or float) tensor,
    B >= 1, an object pixel in every mask (the scores are undefined without one). A clip's
    masks of every frame (B, T, H, W), T > 1, likewise (an object pixel in some frame of each;
    (B, 1, H, W) is refused as images' masks with a channel axis)."""
    video = isinstance(masks, Tensor) and masks.ndim == 4 and masks.shape[1] > 1
    axes = "(B, T, H, W)" if video else "(B, H, W), or a clip's (B, T, H, W)"
    check_maps("object masks", masks, axes, "masks", ndim=4 if video else 3)
    if masks.dtype != torch.bool:
        masks = _binary(masks)
    _check_objects(masks)
    return masks


def mask_shape(x: Tensor) -> tuple[tuple[int, ...], str]:
    """The shape of the masks of images x (B, C, H, W), (B, H, W), or of clips x
    (B, T, C, H, W), (B, T, H, W); and its axes' names."""
    if x.ndim == 5:
        return (len(x), x.shape[1], *x.shape[-2:]), "(B, T, H, W)"
    return (len(x), *x.shape[-2:]), "(B, H, W)"


def _binary(masks: Tensor) -> Tensor:
    """0/1 masks (B, H, W) of any real dtype as bool."""
    check_values_finite("The masks", masks)
    other = ((masks != 0) & (masks != 1)).flatten(1).any(1)
    if bool(other.any()):
        samples = other.nonzero()[:, 0].tolist()
        raise ValueError(
            f"masks must be bool or hold only 0 and 1; the {masks.dtype} masks of samples "
            f"{samples[:10]} hold other values. Threshold soft masks, e.g. masks > 0.5."
        )
    return masks.bool()


def _check_objects(masks: Tensor) -> None:
    """Raise a ValueError naming the masks (B, ...) bool without any object pixel."""
    empty = ~masks.flatten(1).any(1)
    if bool(empty.any()):
        samples = empty.nonzero()[:, 0].tolist()
        raise ValueError(
            f"The masks of samples {samples[:10]} have no object pixel: the pointing game, "
            "energy in the mask and IoU are undefined without an object. Drop those samples."
        )


def _maps_and_masks(
    saliency: SaliencyResult | Tensor, masks: Tensor, ranks: bool = True
) -> tuple[Tensor, Tensor]:
    """Checked masks (B, H, W) bool and the saliency resized to them, (B, H, W) float32; a
    clip's (B, T, H, W) both, each frame resized on its own. ``ranks``: the score ranks pixels,
    so constant maps are refused."""
    masks = check_masks(masks)
    size, frames = tuple(masks.shape[-2:]), masks.shape[1] if masks.ndim == 4 else None
    maps = saliency_maps(
        saliency, len(masks), size, of="masks", allow_constant=not ranks, frames=frames
    )
    maps = maps.float().to(masks.device)
    maps = maps[:, None] if frames is None else frame_maps(maps, frames)  # (B, T or 1, h, w)
    if tuple(maps.shape[-2:]) != size:
        maps = F.interpolate(maps, size=size, mode="bilinear")
    return (maps[:, 0] if frames is None else maps), masks


def pixel_maps(saliency: SaliencyResult | Tensor, masks: Tensor) -> Tensor:
    """Saliency (B, h, w) resized to the masks (B, H, W), float32, after checking both (see
    `check_masks` and `vizkit.analysis.saliency_result.saliency_maps`); a clip's (B, F, h, w)
    to its masks (B, T, H, W)."""
    return _maps_and_masks(saliency, masks, ranks=False)[0]


PEAK_TIE = 1e-5  # pixels this share of a map's range below its maximum tie with the maximum


def pointing_game(saliency: SaliencyResult | Tensor, masks: Tensor, tolerance: int = 0) -> Tensor:
    """Hit (1.0) when the most salient pixel lies on the object, or within ``tolerance`` pixels
    (an int >= 0) of it (Zhang et al. 2018 use 15 px at 224); else 0.0. (B,)

    Pixels within ``PEAK_TIE`` of the map's range below its maximum tie with it, and a tie goes
    to the first of them (row-major): a peak on the border of the patch grid upsamples to
    pixels equal but for rounding, which the CPU's kernel decides, so a plain argmax could
    score one map differently on two machines. A clip's peak is a pixel of one of its maps'
    frames: a token frame's peak hits an object under it in any frame of its tubelet (the
    map is the same on all of them), the tolerance within the frame."""
    tolerance = check_count("tolerance", tolerance, 0)
    maps, masks = _maps_and_masks(saliency, masks)
    if masks.ndim == 4:  # a token frame's peak lies on each frame of its tubelet
        masks = _tubelet_union(masks, _map_frames(saliency))
    target = masks.float().flatten(0, -3)[:, None]  # (B or B * T, 1, H, W)
    if tolerance:
        target = F.max_pool2d(target, 2 * tolerance + 1, stride=1, padding=tolerance)
    target = target.view(len(masks), -1)
    return target.gather(1, first_peak(maps)[:, None])[:, 0]


def _map_frames(saliency: SaliencyResult | Tensor) -> int:
    """F, the frames of a clip's checked maps (B, F, h, w)."""
    return (saliency.maps if isinstance(saliency, SaliencyResult) else saliency).shape[1]


def _tubelet_union(masks: Tensor, frames: int) -> Tensor:
    """Masks (B, T, H, W) where each frame holds the union of the masks of the T / ``frames``
    frames its tubelet spans."""
    b, t, h, w = masks.shape
    union = masks.view(b, frames, t // frames, h, w).any(2, keepdim=True)
    return union.expand(b, frames, t // frames, h, w).reshape(b, t, h, w)


def first_peak(maps: Tensor) -> Tensor:
    """(B,) the flat index of the first pixel (row-major) of each map (B, H, W) or (B, T, H, W)
    within ``PEAK_TIE`` of the map's range below its maximum."""
    flat = maps.flatten(1)
    top, low = flat.max(1, keepdim=True).values, flat.min(1, keepdim=True).values
    tied = flat >= top - PEAK_TIE * (top - low)
    index = torch.arange(flat.shape[1], device=flat.device).expand_as(flat)
    return index.masked_fill(~tied, flat.shape[1]).min(1).values


def energy_in_mask(saliency: SaliencyResult | Tensor, masks: Tensor) -> Tensor:
    """Share of the positive saliency that falls on the object (energy-based pointing game,
    Wang et al. 2020, Score-CAM). (B,); 0 for a map without positive values (constant maps
    are scored: the share needs no ranking)."""
    maps, masks = _maps_and_masks(saliency, masks, ranks=False)
    maps = maps.clamp_min(0)
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
    if fraction is not None:
        fraction = check_number("fraction", fraction, 0, 1, low_open=True)
    maps, masks = _maps_and_masks(saliency, masks)
    maps, flat_masks = maps.flatten(1), masks.flatten(1)
    if fraction is None:
        counts = flat_masks.sum(1)
    else:
        counts = torch.full((len(maps),), max(1, round(fraction * maps.shape[1])))
    top = rank_descending(maps) < counts.to(maps.device)[:, None]
    intersection = (top & flat_masks).sum(1).float()
    union = (top | flat_masks).sum(1).float()
    return intersection / union


def relevance_mass_accuracy(saliency: SaliencyResult | Tensor, masks: Tensor) -> Tensor:
    """Share of the positive relevance inside the mask (Arras et al. 2022, "CLEVR-XAI", Sec.
    4.3), the maps upsampled to the masks: (B,), 0 for a map without positive values. The
    same as `energy_in_mask`, under the name the relevance literature uses."""
    return energy_in_mask(saliency, masks)


def relevance_rank_accuracy(saliency: SaliencyResult | Tensor, masks: Tensor) -> Tensor:
    """Share of the K most relevant pixels inside the mask, K its pixel count (Arras et al.
    2022, Sec. 4.3), the maps upsampled to the masks: (B,). Constant maps are refused."""
    maps, masks = _maps_and_masks(saliency, masks)
    flat_masks = masks.flatten(1)
    counts = flat_masks.sum(1)
    top = rank_descending(maps.flatten(1)) < counts.to(maps.device)[:, None]
    return (top & flat_masks).sum(1).float() / counts.float()


@metric("pointing_game", videos=True, higher=True, short="point", masks=True, quick=True,
        summary="whether the map's peak lies on the object (Zhang et al. 2018)")  # fmt: skip
def _pointing_game(batch: ScoredBatch) -> Tensor:
    return pointing_game(batch.result, batch.masks)


@metric("energy_in_mask", videos=True, higher=True, short="energy", masks=True, quick=True,
        summary="share of the positive saliency on the object (Wang et al. 2020)")  # fmt: skip
def _energy_in_mask(batch: ScoredBatch) -> Tensor:
    return energy_in_mask(batch.result, batch.masks)


@metric("mask_iou", videos=True, higher=True, short="IoU", masks=True, quick=True,
        summary="IoU of the top pixels (the object's area) with the object")  # fmt: skip
def _mask_iou(batch: ScoredBatch) -> Tensor:
    return top_iou(batch.result, batch.masks)


@metric("relevance_mass_accuracy", videos=True, higher=True, masks=True,
        summary="share of the positive relevance on the object (Arras et al. 2022)")  # fmt: skip
def _relevance_mass_accuracy(batch: ScoredBatch) -> Tensor:
    return relevance_mass_accuracy(batch.result, batch.masks)


@metric("relevance_rank_accuracy", videos=True, higher=True, masks=True,
        summary="share of the K top pixels on the object (Arras et al. 2022)")  # fmt: skip
def _relevance_rank_accuracy(batch: ScoredBatch) -> Tensor:
    return relevance_rank_accuracy(batch.result, batch.masks)
