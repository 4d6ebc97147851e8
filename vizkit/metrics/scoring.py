"""The one scoring loop: each method's maps of one batch, scored by the registered metrics
(`vizkit.metrics.registry`). `compare_saliency` runs it on the batch it is given; `evaluate`
runs it on each batch of a data set and journals what it returns."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..analysis.saliency_result import SaliencyResult, constant_maps, saliency_maps
from ..hooks import HookedModel
from ..hooks.scores import is_score_target, select_images
from .faithfulness import CurveEnds, CurveScoring
from .registry import METRICS, ScoredBatch

__all__ = ["MethodScores", "curve_ends", "curve_images", "keyed_notes", "score_methods"]

Method = Callable[[HookedModel, Tensor, object], SaliencyResult]


@dataclass
class MethodScores:
    """One method's scores of a batch of B images.

    Attributes:
        scores: (metrics, B) NaN where the method or a metric refused, or a map is constant.
        result: the method's maps (None where it was skipped).
        notes: why scores are missing: "method" (the method refused the images), "constant
            maps" (which images), or a metric's name (the metric refused).
        seconds: making the maps and scoring them (NaN where skipped).
    """

    scores: Tensor
    result: SaliencyResult | None
    notes: dict[str, str] = field(default_factory=dict)
    seconds: float = math.nan


def keyed_notes(method: str, notes: dict[str, str]) -> dict[str, str]:
    """A method's notes (`MethodScores.notes`) as a table keys them: "method" where the method
    refused the images, "method/constant maps" and "method/metric" for the rest."""
    return {
        method if kind == "method" else f"{method}/{kind}": note for kind, note in notes.items()
    }


def curve_ends(
    hm: HookedModel, x: Tensor, metrics: list[str], scoring: CurveScoring, batch_size: int
) -> CurveEnds:
    """The ends of every curve among ``metrics`` on images x (B, C, H, W), computed once for
    all methods (the logits read by ``scoring`` and each curve's baseline)."""
    baselines = dict.fromkeys(METRICS[m].curve[1] for m in metrics if METRICS[m].curve)
    with torch.no_grad():
        return CurveEnds.compute(hm.model, x, list(baselines), batch_size, scoring)


def curve_images(metrics: list[str], images: int, steps: int) -> int:
    """The perturbed images the curves among ``metrics`` score for one method on ``images``
    images (what the progress bar counts)."""
    return sum(METRICS[m].curve is not None for m in metrics) * images * (steps - 1)


def score_methods(
    hm: HookedModel, x: Tensor, targets: object, masks: Tensor | None,
    methods: list[tuple[str, Method]], metrics: list[str], level: str, steps: int,
    ends: CurveEnds, bar: tqdm | bool = False,
) -> Iterator[tuple[str, MethodScores]]:  # fmt: skip
    """Each method's name and `MethodScores` on images x (B, C, H, W) explained for
    ``targets`` ((B,) classes or a score target), in turn: the method's maps checked to fit
    the images and be finite (else it is skipped), the images whose maps are constant left
    unscored, every other image scored by each of ``metrics``."""
    for name, fn in methods:
        start = time.perf_counter()
        try:
            result = _maps(name, fn, hm, x, targets)
        except ValueError as error:
            nan = torch.full((len(metrics), len(x)), math.nan)
            yield name, MethodScores(nan, None, {"method": str(error)})
            continue
        scored = _scored(hm, x, result, targets, masks, metrics, level, steps, ends, bar)
        scored.seconds = time.perf_counter() - start
        yield name, scored


def _maps(name: str, fn: Method, hm: HookedModel, x: Tensor, targets: object) -> SaliencyResult:
    """The maps of method ``name`` for images x (B, C, H, W) (or clips (B, T, C, H, W)),
    checked to fit them and be finite (a ValueError otherwise; constant maps pass)."""
    result = fn(hm, x, targets)
    if not isinstance(result, SaliencyResult):
        raise TypeError(
            f"Saliency method {name!r} returned {type(result).__name__}; a method must return "
            "a SaliencyResult (see vizkit.analysis.SaliencyResult)."
        )
    frames = x.shape[1] if x.ndim == 5 else None
    saliency_maps(result, len(x), tuple(x.shape[-2:]), allow_constant=True, frames=frames)
    return result


def _batch(
    hm: HookedModel, x: Tensor, result: SaliencyResult, targets: object,
    masks: Tensor | None, level: str, steps: int, ends: CurveEnds, bar: tqdm | bool,
    rows: Tensor,
) -> ScoredBatch:  # fmt: skip
    """The `ScoredBatch` of the images ``rows`` (indices into the batch)."""

    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[rows.to(t.device)]

    return ScoredBatch(
        hm, pick(x), dataclasses.replace(result, maps=pick(result.maps),
                                         targets=pick(result.targets)),
        select_images(targets, rows) if is_score_target(targets) else pick(targets),
        pick(masks), level, steps, ends.rows(rows), bar,
    )  # fmt: skip


def _placed(masks: Tensor | None, flat: Tensor, scored: MethodScores) -> Tensor:
    """(n,) the images whose maps are not ``flat`` (constant) and whose ``masks`` hold an
    object pixel: those the mask metrics score. Images without one are noted in ``scored``
    (a clip whose class shows no object, an image of background only)."""
    if masks is None:
        return (~flat).nonzero()[:, 0]
    empty = ~masks.flatten(1).any(1).cpu()
    if bool(empty.any()):
        scored.notes["no object"] = (
            f"samples {empty.nonzero()[:, 0].tolist()} have no object pixel in their masks: "
            "the mask metrics leave them out"
        )
    return (~flat & ~empty).nonzero()[:, 0]


def _scored(
    hm: HookedModel, x: Tensor, result: SaliencyResult, targets: object,
    masks: Tensor | None, metrics: list[str], level: str, steps: int, ends: CurveEnds,
    bar: tqdm | bool,
) -> MethodScores:  # fmt: skip
    """``result``'s scores: NaN for the images whose maps are constant (they rank nothing)."""
    scores = torch.full((len(metrics), len(x)), math.nan)
    scored = MethodScores(scores, result)
    flat = constant_maps(result.maps).cpu()
    if bool(flat.any()):
        scored.notes["constant maps"] = (
            f"samples {flat.nonzero()[:, 0].tolist()} have constant maps (no pixel ranked "
            "above another): not scored, left out of the means"
        )
    rows = (~flat).nonzero()[:, 0]
    if not len(rows):
        return scored
    batch = _batch(hm, x, result, targets, masks, level, steps, ends, bar, rows)
    placed = _placed(masks, flat, scored)  # the rows with an object, for the mask metrics
    for j, name in enumerate(metrics):
        needs_masks = METRICS[name].masks
        if needs_masks and not len(placed):
            continue
        try:
            if needs_masks and len(placed) < len(rows):
                scores[j, placed] = METRICS[name].fn(
                    _batch(hm, x, result, targets, masks, level, steps, ends, bar, placed)
                ).float().cpu()  # fmt: skip
            else:
                scores[j, rows] = METRICS[name].fn(batch).float().cpu()
        except ValueError as error:
            scored.notes[name] = str(error)
    return scored
