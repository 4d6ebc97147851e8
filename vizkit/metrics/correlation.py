"""Faithfulness correlation (Bhatt et al. 2020, "Evaluating and Aggregating Feature-based Model
Explanations", Sec. 4.1): over random subsets S of the image's units, the Pearson correlation
between the saliency in S and the drop of the target's score when S is replaced by a baseline.
A map is faithful when the units it weighs most are the ones the model needs."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult, saliency_maps
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_count, check_images, check_number
from ..hooks.scores import model_logits
from .faithfulness import (
    BASELINES,
    baseline_images,
    batch_images,
    check_tiles,
    scored_classes,
    unit_saliency,
    unit_size,
)
from .registry import ScoredBatch, metric
from .similarity import pearson

__all__ = ["SCORES", "faithfulness_correlation"]

SCORES = ("probability", "logit")


def _scores(model: nn.Module, images: Tensor, targets: Tensor, score: str) -> Tensor:
    """(n,) the target class's probability or logit for images (n, C, H, W)."""
    out = model_logits(model(images)).float()
    out = out.softmax(-1) if score == "probability" else out
    return out.gather(1, targets[:, None])[:, 0]


@analysis_contract
def faithfulness_correlation(
    model: nn.Module | HookedModel, x: Tensor, saliency: SaliencyResult | Tensor,
    target: Target = None, level: str = "patch", baseline: str = "zero", runs: int = 50,
    fraction: float = 0.1, score: str = "probability", seed: int = 0,
    batch_size: int | None = None,
) -> Tensor:  # fmt: skip
    """(B,) faithfulness correlation per image (higher: more faithful; NaN where the drops or
    the subsets' saliency do not vary).

    Args:
        saliency: a `SaliencyResult` or maps (B, h, w) tiling the images (constant maps refused).
        target: the class scored (int, B ints, or None: the maps' classes, else the prediction).
        level: the units of S, "patch" or "pixel" (as `deletion`); baseline: "zero", "mean" or
            "blur" (`baseline_images`).
        runs: random subsets per image (each a forward pass); fraction: the share of the units
            in each subset, in (0, 1).
        score: "probability" (the softmax, as the curves) or "logit".
        seed: the subsets' generator; batch_size: perturbed images per forward (None: as many
            as hold 2**19 pixels).
    """
    x = check_images(model.model, x)
    runs = check_count("runs", runs, 2)
    fraction = check_number("fraction", fraction, 0, 1, low_open=True, high_open=True)
    check_choice("score", score, SCORES)
    check_choice("baseline", baseline, BASELINES)
    seed = check_count("seed", seed, 0)
    image_size = tuple(x.shape[-2:])
    unit = unit_size(model.model, image_size, level)
    check_tiles(image_size, unit, level)
    maps = saliency_maps(saliency, len(x), image_size)
    cells = unit_saliency(maps.to(x.device), image_size, unit).flatten(1)  # (B, units)
    size = max(1, math.ceil(fraction * cells.shape[1]))
    generator = torch.Generator().manual_seed(seed)
    order = torch.rand(len(x), runs, cells.shape[1], generator=generator).argsort(-1)
    subsets = (order.argsort(-1) < size).to(x.device)  # (B, runs, units): `size` at random
    attributed = (cells[:, None] * subsets).sum(-1).double()  # (B, runs)
    base = baseline_images(x, baseline)
    chunk = batch_images(batch_size, x, model.model)
    grid = (image_size[0] // unit[0], image_size[1] // unit[1])
    with torch.no_grad():
        logits = model_logits(model(x))
        targets = scored_classes(logits, target, saliency)
        clean = _scores(model.model, x, targets, score)
        flat = subsets.flatten(0, 1)  # (B * runs, units)
        image = torch.arange(len(x), device=x.device).repeat_interleave(runs)
        perturbed = []
        for start in range(0, len(flat), chunk):
            rows = slice(start, start + chunk)
            mask = flat[rows].view(-1, 1, *grid).to(x.dtype)
            mask = mask.repeat_interleave(unit[0], -2).repeat_interleave(unit[1], -1)
            b = image[rows]
            images = x[b] * (1 - mask) + base[b] * mask
            perturbed.append(_scores(model.model, images, targets[b], score))
    drops = (clean[:, None] - torch.cat(perturbed).view(len(x), runs)).double()
    return pearson(attributed, drops).float()


@metric("faithfulness_correlation", higher=True, scores=False, perturbs=True,
        summary="correlation of random subsets' saliency with the drops they cause "
                "(Bhatt et al. 2020)")  # fmt: skip
def _faithfulness_correlation(batch: ScoredBatch) -> Tensor:
    return faithfulness_correlation(batch.hm, batch.x, batch.result, batch.targets,
                                    level=batch.level)  # fmt: skip
