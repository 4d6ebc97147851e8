"""`compare_saliency`: run several saliency methods on one batch and score them side by side."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .. import analysis
from ..analysis._model import as_hooked, on_model_device
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel
from ..hooks.targets import target_indices
from .faithfulness import deletion, insertion
from .localization import energy_in_mask, pointing_game, top_iou

__all__ = ["METHODS", "SaliencyTable", "compare_saliency", "random_saliency"]

Method = Callable[[HookedModel, Tensor, Tensor], SaliencyResult]


def random_saliency(hm: HookedModel, x: Tensor, target: Tensor, seed: int = 0) -> SaliencyResult:
    """Uniform noise maps (B, H, W): the chance level every method should beat."""
    generator = torch.Generator().manual_seed(seed)
    maps = torch.rand(len(x), *x.shape[-2:], generator=generator).to(x.device)
    return SaliencyResult(maps, "random", tuple(x.shape[-2:]), {"seed": seed}, targets=target)


METHODS: dict[str, Method] = {
    "rollout": lambda hm, x, t: analysis.rollout(hm, x),
    "grad_rollout": lambda hm, x, t: analysis.grad_rollout(hm, x, t),
    "class_attention": lambda hm, x, t: analysis.class_attention(hm, x),
    "gradcam": lambda hm, x, t: analysis.gradcam(hm, x, t),
    "integrated_gradients": lambda hm, x, t: analysis.integrated_gradients(hm, x, t),
    "saliency": lambda hm, x, t: analysis.saliency(hm, x, t),
    "occlusion": lambda hm, x, t: analysis.occlusion(hm, x, t),
    "random": random_saliency,
}

# metric -> True when higher is better
METRICS = {
    "deletion_auc": False,
    "insertion_auc": True,
    "pointing_game": True,
    "energy_in_mask": True,
    "mask_iou": True,
}


@dataclass
class SaliencyTable:
    """Mean of each metric over the batch, per method.

    Attributes:
        methods: row names.
        metrics: column names (see `METRICS` for which direction is better).
        values: (methods, metrics); NaN where a method does not apply to the model.
        seconds: time each method took to compute its maps.
        notes: why a method was skipped.
        per_image: (methods, metrics, B) the scores of each image (NaN where skipped).
        results: the maps of each method that ran, by name.
    """

    methods: list[str]
    metrics: list[str]
    values: Tensor
    seconds: list[float]
    notes: dict[str, str]
    per_image: Tensor | None = None
    results: dict[str, SaliencyResult] = field(default_factory=dict)

    def best(self, metric: str) -> str:
        """The method with the best value of ``metric``."""
        column = self.values[:, self.metrics.index(metric)]
        column = column if METRICS[metric] else -column
        return self.methods[int(torch.nan_to_num(column, nan=-math.inf).argmax())]

    def to_markdown(self) -> str:
        arrows = [f"{m} {'↑' if METRICS[m] else '↓'}" for m in self.metrics]
        lines = [
            "| method | " + " | ".join(arrows) + " | seconds |",
            "|---" * (len(self.metrics) + 2) + "|",
        ]
        for i, method in enumerate(self.methods):
            cells = [_cell(v, 3) for v in self.values[i].tolist()] + [_cell(self.seconds[i], 2)]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_markdown()


def compare_saliency(
    model: nn.Module | HookedModel,
    x: Tensor,
    methods: Sequence[str | tuple[str, Method]] = ("rollout", "gradcam", "random"),
    masks: Tensor | None = None,
    target: int | Sequence[int] | Tensor | None = None,
    level: str = "patch",
    steps: int = 64,
) -> SaliencyTable:
    """Score saliency methods on one batch: deletion and insertion AUC, and with ``masks``
    (B, H, W) bool the pointing game, energy in the mask and IoU of the top region.

    Args:
        methods: names from `METHODS` or ``(name, fn(hm, x, targets) -> SaliencyResult)``.
        target: the class every method explains (default: the model's prediction).
        level: unit of the deletion/insertion curves, "patch" or "pixel".
        steps: points of each deletion/insertion curve (fewer: faster, coarser AUC).

    A method that raises ValueError for this model (e.g. class attention without a class
    token) gets a NaN row and a warning; the reason is kept in ``notes``.
    """
    hm = as_hooked(model)
    x = on_model_device(hm, x)
    with torch.no_grad():
        targets = target_indices(hm(x), target)
    metrics = ["deletion_auc", "insertion_auc"]
    if masks is not None:
        metrics += ["pointing_game", "energy_in_mask", "mask_iou"]
    names, per_image, seconds, notes, results = [], [], [], {}, {}
    for method in methods:
        name, fn = (method, _lookup(method)) if isinstance(method, str) else method
        names.append(name)
        start = time.perf_counter()
        try:
            result = fn(hm, x, targets)
        except ValueError as error:
            warnings.warn(f"compare_saliency: {name} skipped: {error}", stacklevel=2)
            notes[name] = str(error)
            per_image.append(torch.full((len(metrics), len(x)), math.nan))
            seconds.append(math.nan)
            continue
        seconds.append(time.perf_counter() - start)
        results[name] = result
        scores = {
            "deletion_auc": deletion(hm, x, result, targets, level=level, steps=steps).auc,
            "insertion_auc": insertion(hm, x, result, targets, level=level, steps=steps).auc,
        }
        if masks is not None:
            scores["pointing_game"] = pointing_game(result, masks)
            scores["energy_in_mask"] = energy_in_mask(result, masks)
            scores["mask_iou"] = top_iou(result, masks)
        per_image.append(torch.stack([scores[m].float().cpu() for m in metrics]))
    per_image = torch.stack(per_image)  # (methods, metrics, B)
    return SaliencyTable(names, metrics, per_image.mean(-1), seconds, notes, per_image, results)


def _cell(value: float, digits: int) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def _lookup(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"Unknown saliency method {name!r}; known: {', '.join(METHODS)}.")
    return METHODS[name]
