"""Deletion and insertion curves (Petsiuk et al. 2018, RISE, Sec. 4.1) for any saliency map.

Deletion replaces the most salient units first with a baseline and tracks the target class's
probability (a faithful map makes it fall fast: low AUC is good); insertion starts from the
baseline and reveals the most salient units first (high AUC is good). Units are patches or pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis._model import as_hooked, on_model_device
from ..analysis.saliency_result import SaliencyResult, check_maps_fit, rank_descending
from ..hooks import HookedModel, Target
from ..hooks.targets import target_indices

__all__ = ["BASELINES", "CurveResult", "baseline_images", "deletion", "insertion"]

BASELINES = ("blur", "mean", "zero")


@dataclass
class CurveResult:
    """A deletion or insertion curve per image.

    Attributes:
        kind: "deletion" or "insertion".
        fractions: (S + 1,) share of units removed (deletion) or revealed (insertion).
        scores: (B, S + 1) probability of the target class at each step.
        auc: (B,) area under each curve (trapezoid rule over ``fractions``).
        targets: (B,) the classes scored.
        options: level, baseline, steps, unit size.
    """

    kind: str
    fractions: Tensor
    scores: Tensor
    auc: Tensor
    targets: Tensor
    options: dict = field(default_factory=dict)


def baseline_images(x: Tensor, kind: str) -> Tensor:
    """What removed units are replaced with, (B, C, H, W), in ``x``'s (normalized) space:
    ``"zero"`` zeros (the normalization mean colour), ``"mean"`` each image's channel means,
    ``"blur"`` a Gaussian blur with sigma = side / 16 (RISE's insertion start)."""
    if kind == "zero":
        return torch.zeros_like(x)
    if kind == "mean":
        return x.mean((2, 3), keepdim=True).expand_as(x)
    if kind == "blur":
        sigma = max(x.shape[-2:]) / 16
        radius = max(1, min(math.ceil(3 * sigma), min(x.shape[-2:]) - 1))
        t = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
        kernel = torch.exp(-(t**2) / (2 * sigma**2))
        kernel = kernel / kernel.sum()
        channels = x.shape[1]
        rows = kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1)
        out = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), rows, groups=channels)
        cols = kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1)
        return F.conv2d(F.pad(out, (radius, radius, 0, 0), mode="reflect"), cols, groups=channels)
    raise ValueError(f"baseline must be one of {BASELINES}; got {kind!r}.")


def _unit_size(hm: HookedModel, x: Tensor, level: str) -> tuple[int, int]:
    if level == "pixel":
        return 1, 1
    if level != "patch":
        raise ValueError(f"level must be 'patch' or 'pixel'; got {level!r}.")
    pe = getattr(hm.model, "patch_embed", None)
    if pe is not None:
        return tuple(int(p) for p in pe.patch_size)
    return tuple(max(1, s // 8) for s in x.shape[-2:])  # CNNs: an 8 x 8 grid of cells


def _unit_saliency(maps: Tensor, image_size: tuple[int, int], unit: tuple[int, int]) -> Tensor:
    """Saliency per unit (B, gh, gw): maps upsampled to pixels, averaged over each unit."""
    h, w = image_size
    if h % unit[0] or w % unit[1]:
        raise ValueError(f"Image size {image_size} is not a multiple of the unit size {unit}.")
    grid = (h // unit[0], w // unit[1])
    if tuple(maps.shape[-2:]) == grid:
        return maps.float()
    pixels = F.interpolate(maps[:, None].float(), size=image_size, mode="bilinear")
    return F.avg_pool2d(pixels, unit)[:, 0]


def _curve(
    kind: str,
    model: nn.Module | HookedModel,
    x: Tensor,
    saliency: SaliencyResult | Tensor,
    target: Target,
    level: str,
    baseline: str,
    steps: int,
    batch_size: int,
) -> CurveResult:
    hm = as_hooked(model)
    x = on_model_device(hm, x)
    maps = saliency.maps if isinstance(saliency, SaliencyResult) else saliency
    check_maps_fit(maps, len(x), tuple(x.shape[-2:]))
    unit = _unit_size(hm, x, level)
    cells = _unit_saliency(maps.to(x.device), tuple(x.shape[-2:]), unit)  # (B, gh, gw)
    units = cells[0].numel()
    steps = min(steps, units)
    counts = torch.tensor([math.ceil(k * units / steps) for k in range(steps + 1)])
    rank = rank_descending(cells.flatten(1))
    base = baseline_images(x, baseline)
    with torch.no_grad():
        logits = hm(x)
        targets = target_indices(logits, target)
        scores = torch.empty(len(x), steps + 1, device=x.device)
        pairs = [(b, k) for b in range(len(x)) for k in range(steps + 1)]
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start : start + batch_size]
            b = torch.tensor([p[0] for p in chunk], device=x.device)
            k = torch.tensor([p[1] for p in chunk])
            chosen = rank[b] < counts[k].to(x.device)[:, None]  # (n, units) first units
            mask = chosen.view(-1, 1, *cells.shape[-2:]).float()
            mask = mask.repeat_interleave(unit[0], -2).repeat_interleave(unit[1], -1)
            source, fill = (base[b], x[b]) if kind == "insertion" else (x[b], base[b])
            images = source * (1 - mask) + fill * mask
            probs = hm(images).softmax(-1)
            scores[b, k.to(x.device)] = probs.gather(1, targets[b][:, None])[:, 0]
    fractions = (counts.float() / units).to(x.device)
    return CurveResult(
        kind=kind,
        fractions=fractions,
        scores=scores,
        auc=torch.trapezoid(scores, fractions, dim=-1),
        targets=targets,
        options={"level": level, "baseline": baseline, "steps": steps, "unit": unit},
    )


def deletion(
    model: nn.Module | HookedModel,
    x: Tensor,
    saliency: SaliencyResult | Tensor,
    target: Target = None,
    level: str = "patch",
    baseline: str = "zero",
    steps: int = 64,
    batch_size: int = 256,
) -> CurveResult:
    """Deletion curve: remove the most salient units first (lower AUC = more faithful).

    Args:
        saliency: a `SaliencyResult` or maps (B, h, w) at any resolution.
        target: class scored: int, B ints or None (argmax of the clean image).
        level: "patch" (the model's patches; CNNs: an 8 x 8 grid) or "pixel".
        baseline: "zero", "mean" or "blur" (see `baseline_images`).
        steps: number of removal steps (at most the number of units).
        batch_size: perturbed images per forward pass.
    """
    return _curve("deletion", model, x, saliency, target, level, baseline, steps, batch_size)


def insertion(
    model: nn.Module | HookedModel,
    x: Tensor,
    saliency: SaliencyResult | Tensor,
    target: Target = None,
    level: str = "patch",
    baseline: str = "blur",
    steps: int = 64,
    batch_size: int = 256,
) -> CurveResult:
    """Insertion curve: reveal the most salient units first, starting from ``baseline``
    (higher AUC = more faithful). Arguments as in `deletion`."""
    return _curve("insertion", model, x, saliency, target, level, baseline, steps, batch_size)
