"""The saliency-metric registry: a metric is defined once, beside the function it scores with,
registered with `metric`, and everything that scores or lists metrics (`compare_saliency` on one
batch, `evaluate` over a data set, the tables' arrows, the docs) reads this registry.

A metric is ``fn(batch: ScoredBatch) -> (B,)``: one score per image of one method's maps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from ..hooks.inputs import as_names

if TYPE_CHECKING:
    from tqdm.auto import tqdm

    from ..analysis.saliency_result import SaliencyResult
    from ..hooks import HookedModel
    from .faithfulness import CurveEnds

__all__ = ["METRICS", "Metric", "ScoredBatch", "headed", "metric", "selected_metrics"]


@dataclass(frozen=True)
class ScoredBatch:
    """What a metric scores: one method's maps of a batch.

    Attributes:
        hm: the model; x: (B, C, H, W) the images (a video model's clips (B, T, C, H, W)).
        result: the method's `SaliencyResult`, maps (B, h, w) (clips: (B, F, h, w)), none of
            them constant.
        targets: (B,) the classes explained, or a score target (`vizkit.targets`).
        masks: (B, H, W) bool object masks (clips: (B, T, H, W)), or None.
        level, steps: the perturbation curves' unit ("patch" or "pixel") and steps.
        ends: the curves' ends on these images (`CurveEnds`), shared by every method.
        bar: the open progress bar the curves advance, or False.
    """

    hm: HookedModel
    x: Tensor
    result: SaliencyResult
    targets: object
    masks: Tensor | None
    level: str
    steps: int
    ends: CurveEnds
    bar: tqdm | bool = False

    @property
    def maps(self) -> Tensor:
        """(B, h, w) the maps scored (clips: (B, F, h, w))."""
        return self.result.maps


@dataclass(frozen=True)
class Metric:
    """A registered metric.

    Attributes:
        name: the name ``metrics=[...]`` and the tables use.
        fn: ``fn(batch: ScoredBatch) -> (B,)`` a score per image.
        higher: whether higher is better.
        summary: one line for the tables: what is measured, and its paper.
        masks: whether it needs object masks.
        scores: whether it takes a score target (`vizkit.targets`) as well as classes.
        curve: ``(kind, baseline)`` of a perturbation curve whose ends (`CurveEnds`) it shares
            with the other curves of the batch; None for any other metric.
        perturbs: whether it reads the model on perturbed images (deletion, ROAD, average
            drop, ...): such scores measure noise where predictions are near chance.
        quick: whether `compare_saliency` scores it unless told otherwise (the maps, the two
            shared curves; `evaluate` scores every metric that applies).
        short: the label of its score in a figure's title ("del").
        videos: whether it scores a video model's clips and their maps.
    """

    name: str
    fn: Callable[[ScoredBatch], Tensor]
    higher: bool
    summary: str
    masks: bool = False
    scores: bool = True
    curve: tuple[str, str] | None = None
    perturbs: bool = False
    quick: bool = False
    short: str = ""
    videos: bool = False


METRICS: dict[str, Metric] = {}


def metric(
    name: str, *, higher: bool, summary: str, masks: bool = False, scores: bool = True,
    curve: tuple[str, str] | None = None, perturbs: bool = False, quick: bool = False,
    short: str | None = None, videos: bool = False,
) -> Callable[[Callable], Callable]:  # fmt: skip
    """Register the decorated ``fn(batch: ScoredBatch) -> (B,)`` as metric ``name``; returns
    it unchanged."""

    def register(fn: Callable) -> Callable:
        if name in METRICS and METRICS[name].fn is not fn:
            raise ValueError(f"A metric {name!r} is registered already.")
        perturbed = perturbs or curve is not None
        METRICS[name] = Metric(name, fn, higher, summary, masks, scores, curve, perturbed, quick,
                               short or name, videos)  # fmt: skip
        return fn

    return register


def selected_metrics(
    metrics: str | Sequence[str], has_masks: bool, scored: bool, videos: bool = False
) -> list[str]:
    """The names of ``metrics``: "quick" (those marked quick) or "all" (every one), each
    only where it applies (the mask metrics where there are ``has_masks``, those of a class's
    probability unless ``scored`` by a score target, those of clips for ``videos``); or names,
    checked to apply."""
    if metrics in ("quick", "all"):
        return [
            name for name, m in METRICS.items()
            if (m.quick or metrics == "all") and (has_masks or not m.masks)
            and (m.scores or not scored) and (m.videos or not videos)
        ]  # fmt: skip
    names = as_names("metrics", metrics)
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise KeyError(
            f"Unknown metrics {unknown}; known: {', '.join(METRICS)} (or 'quick', 'all')."
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"Metric names must be distinct; {repeated} appear more than once.")
    classes_only = [m for m in names if scored and not METRICS[m].scores]
    if classes_only:
        raise ValueError(
            f"{classes_only} score a class's probability, and the target is a score on the "
            f"output; these take one: {', '.join(n for n, m in METRICS.items() if m.scores)}."
        )
    images_only = [m for m in names if videos and not METRICS[m].videos]
    if images_only:
        raise ValueError(
            f"{images_only} score images and do not take a video model's clips yet; these "
            f"do: {', '.join(n for n, m in METRICS.items() if m.videos)}."
        )
    needing = [m for m in names if METRICS[m].masks]
    if needing and not has_masks:
        raise ValueError(f"{needing} need object masks, and there are none.")
    return list(names)


def headed(name: str) -> str:
    """A table's column head for metric ``name``: the name and which way is better ("↑"
    higher, "↓" lower), or the name alone for a metric not registered in this session (a
    table saved with a notebook's own metric)."""
    if name not in METRICS:
        return name
    return f"{name} {'↑' if METRICS[name].higher else '↓'}"
