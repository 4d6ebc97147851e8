"""`compare_saliency`: run several saliency methods on one batch and score them side by side."""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis._model import self_attention_names
from ..analysis.result import Result
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target, TokenLayout
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_images
from ..hooks.scores import is_score_target, target_indices, target_label
from ..methods.registry import METHODS, registered, selected_methods
from .chance import near_chance, prediction_certainty
from .faithfulness import LEVELS, CurveScoring, batch_images, curve_steps, unit_count
from .localization import check_masks
from .registry import METRICS, headed, selected_metrics
from .scoring import curve_ends, curve_images, score_methods

__all__ = ["SaliencyTable", "compare_saliency", "resolve_methods"]

Method = Callable[[HookedModel, Tensor, Tensor], SaliencyResult]


@dataclass(repr=False)
class SaliencyTable(Result):
    """Mean of each metric over the batch, per method.

    Attributes:
        methods: row names.
        metrics: column names (`vizkit.metrics.METRICS` says which direction is better).
        values: (methods, metrics); NaN where a method does not apply to the model.
        seconds: wall time of each method: making its maps and scoring them (NaN if skipped).
        notes: why a method was skipped, or which samples it left unscored.
        per_image: (methods, metrics, B) the scores of each image (NaN where skipped).
        results: the maps of each method that ran, by name.
        options: ``level`` and ``steps`` of the curves.
        layout, image_size: the model's tokens and (H, W) of the images.
        near_chance: (B,) bool, the images whose prediction is too close to chance for
            deletion and insertion to mean anything (`vizkit.metrics.near_chance`).
        target_probability, prediction_entropy: (B,) the probability of the class explained
            and the softmax's entropy over its maximum (`vizkit.metrics.prediction_certainty`).
    """

    methods: list[str]
    metrics: list[str]
    values: Tensor
    seconds: list[float]
    notes: dict[str, str]
    per_image: Tensor | None = None
    results: dict[str, SaliencyResult] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None
    near_chance: Tensor | None = None
    target_probability: Tensor | None = None
    prediction_entropy: Tensor | None = None

    def best(self, metric: str) -> str:
        """The method with the best value of ``metric`` (one of ``metrics``). Deletion and
        insertion are not ranked when every prediction is near chance (see `caution`)."""
        column = self.values[:, self.metrics.index(check_choice("metric", metric, self.metrics))]
        if bool(column.isnan().all()):
            raise ValueError(
                f"No method has a {metric} score (every method was skipped; see notes)."
            )
        if metric not in METRICS:
            raise KeyError(
                f"{metric!r} is not a registered metric in this session, so which way is better "
                "is unknown: register it (vk.metrics.metric) to rank by it."
            )
        if not self._ranked(metric):
            raise ValueError(
                f"{metric} is not ranked: {self.caution()} The scores are in table.values."
            )
        column = column if METRICS[metric].higher else -column
        return self.methods[int(torch.nan_to_num(column, nan=-math.inf).argmax())]

    def _ranked(self, metric: str) -> bool:
        """Whether ``metric`` is ranked: registered (which way is better is known), and not
        one that reads the model on perturbed images (`Metric.perturbs`) where every
        prediction is near chance."""
        if metric not in METRICS:  # a notebook's own metric, not registered here
            return False
        chance = self.near_chance is not None and bool(self.near_chance.all())
        return not (chance and METRICS[metric].perturbs)

    def ranking(self) -> list[str]:
        """The methods that ran, best first by their mean rank over the metrics each has (1 is
        best in a metric; ties share their mean rank). The metrics that perturb the images are
        left out where every prediction is near chance (see `caution`)."""
        ranks = self.mean_ranks()
        ran = [i for i in range(len(self.methods)) if not math.isnan(ranks[i])]
        return [self.methods[i] for i in sorted(ran, key=lambda i: ranks[i])]

    def mean_ranks(self) -> list[float]:
        """Each method's rank (1 = best) averaged over the metrics it has a score in; NaN for
        a method with none."""
        usable = [j for j, metric in enumerate(self.metrics) if self._ranked(metric)]
        ranks = torch.full((len(self.methods), len(usable)), math.nan, dtype=torch.float64)
        for column, j in enumerate(usable):
            values = self.values[:, j].double()
            values = values if METRICS[self.metrics[j]].higher else -values
            scored = (~values.isnan()).nonzero()[:, 0]
            ranks[scored, column] = _tied_ranks(-values[scored])
        return ranks.nanmean(1).tolist() if usable else [math.nan] * len(self.methods)

    def caution(self, image: int | None = None) -> str:
        """A warning naming the images whose prediction is near chance (of ``image`` only,
        when given); "" when there are none."""
        if self.near_chance is None:
            return ""
        chosen = range(len(self.near_chance)) if image is None else [image]
        flagged = [i for i in chosen if bool(self.near_chance[i])]
        if not flagged:
            return ""
        if image is not None:
            which = f"Prediction near chance on image {image}"
        elif len(flagged) == len(self.near_chance):
            which = "Predictions near chance on every image"
        else:
            which = f"Predictions near chance on images {_listed(flagged)}"
        probability = _span(self.target_probability[flagged], 3)
        entropy = _span(self.prediction_entropy[flagged], 2)
        return (
            f"{which} (probability of the class explained {probability}, softmax entropy "
            f"{entropy} of the maximum): deletion and insertion scores measure noise here, "
            "not the methods."
        )

    def settings(self) -> str:
        """What the scores and seconds are: the curves' baselines, steps and level."""
        if not self.options:
            return ""
        seconds = "seconds: making each method's maps and scoring them."
        curves = " and ".join(dict.fromkeys(
            f"{METRICS[m].curve[0]} ({METRICS[m].curve[1]} baseline)"
            for m in self.metrics if m in METRICS and METRICS[m].curve
        ))  # fmt: skip
        if not curves:
            return seconds.capitalize()
        return (
            f"{curves.capitalize()} curves of {self.options['steps']} steps at "
            f"{self.options['level']} level; {seconds}"
        )

    def to_markdown(self) -> str:
        """The table in markdown, the caution (if any), notes and settings below it."""
        arrows = [headed(m) for m in self.metrics]
        lines = [
            "| method | " + " | ".join(arrows) + " | mean rank ↓ | seconds |",
            "|---" * (len(self.metrics) + 3) + "|",
        ]
        ranks = self.mean_ranks()
        for i, method in enumerate(self.methods):
            cells = [_cell(v, 3) for v in self.values[i].tolist()]
            cells += [_cell(ranks[i], 1), _cell(self.seconds[i], 2)]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        below = [f"**Caution**: {c}" for c in [self.caution()] if c] + self._footnotes()
        return "\n".join(lines + ["", *below] if below else lines)

    def __str__(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        """The table as HTML (JupyterLab, the report): arrows say which direction is better;
        the notes follow as a caption."""
        arrows = [headed(m) for m in self.metrics]
        columns = ["method", *arrows, "mean rank ↓", "seconds"]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        rows = ""
        ranks = self.mean_ranks()
        for i, method in enumerate(self.methods):
            values = [_cell(v, 3) for v in self.values[i].tolist()]
            values += [_cell(ranks[i], 1), _cell(self.seconds[i], 3)]
            cells = "".join(f"<td>{v}</td>" for v in values)
            rows += f"<tr><td>{html.escape(method)}</td>{cells}</tr>"
        lines = [html.escape(line) for line in self._footnotes()]
        caution = self.caution()
        if caution:
            lines.insert(0, f"<strong>⚠ {html.escape(caution)}</strong>")
        caption = f"<caption>{'<br>'.join(lines)}</caption>" if lines else ""
        return f"<table class='scores'>{caption}<tr>{head}</tr>{rows}</table>"

    def _footnotes(self) -> list[str]:
        """The notes on skipped methods and samples, and the settings."""
        notes = "; ".join(f"{name}: {note}" for name, note in self.notes.items())
        return [line for line in (notes, self.settings()) if line]


@analysis_contract
def compare_saliency(
    model: nn.Module | HookedModel,
    x: Tensor,
    methods: str | Sequence[str | tuple[str, Method]] = "default",
    masks: Tensor | None = None,
    target: Target = None,
    level: str = "patch",
    steps: int | None = None,
    progress: bool = True,
    metrics: str | Sequence[str] = "quick",
) -> SaliencyTable:
    """Score saliency methods on one batch, by default by deletion and insertion AUC, and
    with ``masks`` the pointing game, energy in the mask and IoU of the top region.

    Args:
        model: any model (wrappers unwrapped), run in eval mode, its training flags restored.
        x: (B, C, H, W) images, B >= 1, finite.
        methods: distinct names from `vizkit.methods.METHODS` or ``(name, fn(hm, x, targets)
            -> SaliencyResult)``, at least one; "all": every registered method (those that do
            not apply to the model are noted and left unscored); "default" (the default): the
            registry's defaults (`vizkit.methods.default_methods`), the report's.
        masks: (B, H, W) bool (or 0/1) object masks of the images, each with an object pixel.
        target: the class every method explains (default: the model's prediction), or a
            score target (`vizkit.targets`, a callable): the curves then track its score.
        level: unit of the deletion/insertion curves, "patch" or "pixel".
        steps: steps of each deletion/insertion curve, in [1, units]; None: min(16, units).
            Each step is a forward pass of every image for every method and curve, so the
            cost grows with it: ``steps=64`` gives finer AUCs at 4x.
        progress: show a progress bar over the perturbed images (tqdm, notebook-aware).
        metrics: names of `vizkit.metrics.METRICS`; "quick" (the default): those marked quick
            that apply; "all": every one that applies (as `evaluate` scores a data set).

    Every input is checked before any method runs. A method that raises ValueError for this
    model (e.g. class attention without a class token), or whose maps do not fit the images or
    hold NaN / Inf, gets a NaN row and a warning; the reason is kept in ``notes``. Images whose
    prediction is near chance (`vizkit.metrics.near_chance`) are named in a warning and in
    the table (``near_chance``, `SaliencyTable.caution`).
    """
    x = check_images(model.model, x)
    chosen = resolve_methods(methods, model)
    check_choice("level", level, LEVELS)
    steps = curve_steps(steps, unit_count(model.model, tuple(x.shape[-2:]), level), level)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False; got {progress!r}.")
    if masks is not None:
        masks = _masks_for(masks, x)
    scoring = CurveScoring.of(target)
    names = selected_metrics(metrics, masks is not None, scoring.score is not None)
    ends = curve_ends(model, x, names, scoring, batch_images(None, x, model.model))
    logits = ends.logits
    targets = target if scoring.score is not None else target_indices(logits, target)
    per_image, seconds, notes, results = [], [], {}, {}
    share = curve_images(names, len(x), steps)  # perturbed images per method
    with tqdm(total=share * len(chosen), desc="compare_saliency", unit="image",
              disable=not progress, leave=False) as bar:  # fmt: skip
        scored = score_methods(model, x, targets, masks, chosen, names, level, steps, ends, bar)
        bar.set_postfix_str(chosen[0][0])
        for i, (name, method) in enumerate(scored):
            bar.update(share * (i + 1) - bar.n)  # what constant or skipped maps left unrun
            per_image.append(method.scores)
            seconds.append(method.seconds)
            if method.result is not None:
                results[name] = method.result
            for kind, note in method.notes.items():
                note = note if kind in ("method", "constant maps") else f"{kind}: {note}"
                notes[name] = f"{notes[name]}; {note}" if name in notes else note
                said = f"{name} skipped: {note}" if kind == "method" else f"{name}: {note}."
                warnings.warn(f"compare_saliency: {said}", stacklevel=3)
            if i + 1 < len(chosen):
                bar.set_postfix_str(chosen[i + 1][0])
    per_image = torch.stack(per_image)  # (methods, metrics, B)
    image_size = tuple(x.shape[-2:])
    certainty = {}
    if scoring.score is None:  # a class's probability: is it near chance?
        entropy, probability = prediction_certainty(logits, targets)
        certainty = {
            "near_chance": near_chance(logits, targets).cpu(),
            "target_probability": probability.cpu(),
            "prediction_entropy": entropy.cpu(),
        }
    table = SaliencyTable(
        [name for name, _ in chosen], names, per_image.nanmean(-1), seconds, notes,
        per_image, results, options={"level": level, "steps": steps, **_scored(target)},
        layout=model.token_layout(image_size), image_size=image_size, **certainty,
    )  # fmt: skip
    if table.caution():
        warnings.warn(f"compare_saliency: {table.caution()}", stacklevel=3)
    return table


def _scored(target: Target) -> dict:
    """The table's note of what the curves scored: a score target's label (none for classes)."""
    if not is_score_target(target):
        return {}
    return {"score": target_label(target)}


def _masks_for(masks: Tensor, x: Tensor) -> Tensor:
    """``masks`` checked (`check_masks`) as bool (B, H, W) matching images x (B, C, H, W)."""
    masks = check_masks(masks)
    expected = (len(x), *x.shape[-2:])
    if tuple(masks.shape) != expected:
        raise ValueError(
            f"masks must be (B, H, W) = {expected} to match the images; got "
            f"{tuple(masks.shape)}. Pass one mask per image, at the images' size."
        )
    return masks.to(x.device)


def resolve_methods(
    methods: str | Sequence[str | tuple[str, Method]], hm: HookedModel
) -> list[tuple[str, Method]]:
    """(name, fn) of each method: names looked up in `vizkit.methods.METHODS`, "all" for
    every registered method, "default" for `default_methods`; distinct names, at least one."""
    if methods in ("all", "default"):
        methods = selected_methods(methods, bool(self_attention_names(hm)))
    if isinstance(methods, str):  # one method's name
        methods = [methods]
    if not isinstance(methods, Sequence):
        raise TypeError(
            f"methods must be a name, a list of names or (name, fn) pairs, 'all' or "
            f"'default'; got {methods!r}."
        )
    if not methods:
        known = ", ".join(METHODS)
        raise ValueError(f"methods is empty; pass at least one of {known}.")
    chosen = [(m, registered(m)) if isinstance(m, str) else _pair(m) for m in methods]
    names = [name for name, _ in chosen]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"Method names must be distinct; {repeated} appear more than once.")
    return chosen


def _pair(method: object) -> tuple[str, Method]:
    """A custom ``(name, fn)`` method, checked."""
    if (
        not isinstance(method, tuple)
        or len(method) != 2
        or not isinstance(method[0], str)
        or not callable(method[1])
    ):
        raise TypeError(
            "A method must be a name from vizkit.methods.METHODS or a (name, fn(hm, x, "
            f"targets) -> SaliencyResult) pair; got {method!r}."
        )
    return method


def _tied_ranks(values: Tensor) -> Tensor:
    """Ranks 1..n of ``values`` (n,), smallest first; tied values share their mean rank."""
    order = values.argsort()
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(1, len(values) + 1, dtype=values.dtype)
    for value in values.unique():
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _span(values: Tensor, digits: int) -> str:
    """ "0.003", or "0.001 to 0.004" when the (n,) values differ at ``digits`` decimals."""
    low, high = (f"{v:.{digits}f}" for v in (values.min().item(), values.max().item()))
    return low if low == high else f"{low} to {high}"


def _listed(indices: list[int]) -> str:
    """The first ten indices, "..." after them."""
    return str(indices[:10])[:-1] + (", ...]" if len(indices) > 10 else "]")


def _cell(value: float, digits: int) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
