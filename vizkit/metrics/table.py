"""`SaliencyTable`: saliency methods' scores by the registered metrics, per image, the one table
`compare_saliency` (one batch) and `evaluate` (a data set) return: means with standard errors,
each method's mean rank and seconds, and a caution where predictions are near chance."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..analysis.result import Result
from ..analysis.saliency_result import SaliencyResult
from ..hooks import TokenLayout
from ..hooks.inputs import check_choice
from .registry import METRICS, headed

__all__ = ["SaliencyTable"]


@dataclass(repr=False)
class SaliencyTable(Result):
    """Each method's score of each image by each metric, and what they rest on.

    Attributes:
        methods: row names.
        metrics: column names (`vizkit.metrics.METRICS` says which direction is better).
        per_image: (methods, metrics, N) every image's score; NaN where a method or metric did
            not apply (see ``notes``) or the image's map was constant.
        seconds: each method's wall time making its maps and scoring them (NaN if skipped or
            not recorded).
        notes: why scores are missing: "method" (the method refused the images), "method/
            constant maps" (which images), "method/metric" (the metric refused).
        options: the settings: the curves' ``level`` and ``steps``, and (over a data set)
            ``batch_size``, ``targets``, ``out``.
        results: the maps of each method that ran, by name (one batch in memory only).
        layout, image_size: the model's tokens and (H, W) of the images (one batch).
        near_chance: (N,) bool, the images whose prediction is too close to chance for the
            metrics that perturb images to mean anything (`vizkit.metrics.near_chance`); None
            where a score target (not a class) is explained.
        target_probability, prediction_entropy: (N,) the probability of the class explained
            and the softmax's entropy over its maximum (`vizkit.metrics.prediction_certainty`).
    """

    methods: list[str]
    metrics: list[str]
    per_image: Tensor
    seconds: list[float]
    notes: dict[str, str] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    results: dict[str, SaliencyResult] = field(default_factory=dict)
    layout: TokenLayout | None = None
    image_size: tuple[int, int] | None = None
    near_chance: Tensor | None = None
    target_probability: Tensor | None = None
    prediction_entropy: Tensor | None = None

    @property
    def mean(self) -> Tensor:
        """(methods, metrics) the mean over the images that have a score (NaN: none has)."""
        return self.per_image.nanmean(-1)

    @property
    def sem(self) -> Tensor:
        """(methods, metrics) the standard error of that mean (NaN below two scores)."""
        count = (~self.per_image.isnan()).sum(-1)
        spread = (self.per_image - self.mean[..., None]).nan_to_num().pow(2).sum(-1)
        std = (spread / (count - 1).clamp_min(1)).sqrt()
        return torch.where(count > 1, std / count.clamp_min(1).sqrt(), float("nan"))

    def best(self, metric: str) -> str:
        """The method with the best mean ``metric`` (one of ``metrics``). The metrics that
        perturb the images are not ranked when every prediction is near chance (`caution`)."""
        column = self.mean[:, self.metrics.index(check_choice("metric", metric, self.metrics))]
        if bool(column.isnan().all()):
            raise ValueError(f"No method has a {metric} score (see table.notes for why).")
        if metric not in METRICS:
            raise KeyError(
                f"{metric!r} is not a registered metric in this session, so which way is better "
                "is unknown: register it (vk.metrics.metric) to rank by it."
            )
        if not self.ranked(metric):
            raise ValueError(
                f"{metric} is not ranked: {self.caution()} The scores are in table.per_image."
            )
        column = column if METRICS[metric].higher else -column
        return self.methods[int(torch.nan_to_num(column, nan=-math.inf).argmax())]

    def ranked(self, metric: str) -> bool:
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
        """Each method's rank (1 = best) by its mean score, averaged over the metrics it has a
        score in; NaN for a method with none."""
        usable = [j for j, metric in enumerate(self.metrics) if self.ranked(metric)]
        ranks = torch.full((len(self.methods), len(usable)), math.nan, dtype=torch.float64)
        mean = self.mean.double()
        for column, j in enumerate(usable):
            values = mean[:, j] if METRICS[self.metrics[j]].higher else -mean[:, j]
            scored = (~values.isnan()).nonzero()[:, 0]
            ranks[scored, column] = _tied_ranks(-values[scored])
        return ranks.nanmean(1).tolist() if usable else [math.nan] * len(self.methods)

    def scored_images(self) -> str:
        """How many images the means average: "16 images", or "12 of 16 images" where some
        have no score at all (a method or metric refused their batch, constant maps)."""
        images = self.per_image.shape[-1]
        scored = int((~self.per_image.isnan()).flatten(0, 1).any(0).sum())
        unit = "image" if images == 1 else "images"
        return f"{images} {unit}" if scored == images else f"{scored} of {images} {unit}"

    def near_chance_images(self, image: int | None = None) -> str:
        """Which images' predictions are near chance (of ``image`` only, when given): "Predictions
        near chance on every image", "... on images 0, 3", "Prediction near chance on image 2";
        "" when there are none."""
        flagged = self._flagged(image)
        if not flagged:
            return ""
        if image is not None:
            return f"Prediction near chance on image {image}"
        if len(flagged) == len(self.near_chance):
            return "Predictions near chance on every image"
        return f"Predictions near chance on images {_listed(flagged)}"

    def caution(self, image: int | None = None) -> str:
        """A warning naming the images whose prediction is near chance (of ``image`` only,
        when given) and what that means for the scores; "" when there are none."""
        flagged = self._flagged(image)
        if not flagged:
            return ""
        which = self.near_chance_images(image)
        probability = _span(self.target_probability[flagged], 3)
        entropy = _span(self.prediction_entropy[flagged], 2)
        return (
            f"{which} (probability of the class explained {probability}, softmax entropy "
            f"{entropy} of the maximum): deletion and insertion scores measure noise here, "
            "not the methods."
        )

    def _flagged(self, image: int | None) -> list[int]:
        """The images (of ``image`` only, when given) whose prediction is near chance."""
        if self.near_chance is None:
            return []
        chosen = range(len(self.near_chance)) if image is None else [image]
        return [i for i in chosen if bool(self.near_chance[i])]

    def settings(self) -> str:
        """What the cells and seconds are: means over how many images, the curves' baselines,
        steps and level."""
        seconds = "seconds: making each method's maps and scoring them."
        means = f"Mean ± standard error over {self.scored_images()}; {seconds}"
        curves = " and ".join(dict.fromkeys(
            f"{METRICS[m].curve[0]} ({METRICS[m].curve[1]} baseline)"
            for m in self.metrics if m in METRICS and METRICS[m].curve
        ))  # fmt: skip
        if not curves or "steps" not in self.options:
            return means
        steps = f"curves of {self.options['steps']} steps at {self.options['level']} level"
        return f"{curves.capitalize()} {steps}. {means}"

    def to_markdown(self) -> str:
        """The table in markdown, the caution (if any), notes and settings below it."""
        lines = [
            "| " + " | ".join(self._columns()) + " |",
            "|---" * (len(self.metrics) + 3) + "|",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self._rows()]
        below = [f"**Caution**: {c}" for c in [self.caution()] if c] + self._footnotes()
        return "\n".join(lines + ["", *below] if below else lines)

    def __str__(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        """The table as HTML (JupyterLab, the report): arrows say which direction is better;
        the caution, notes and settings follow as a caption."""
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self._columns())
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self._rows()
        )
        lines = [html.escape(line) for line in self._footnotes()]
        caution = self.caution()
        if caution:
            lines.insert(0, f"<strong>⚠ {html.escape(caution)}</strong>")
        caption = f"<caption>{'<br>'.join(lines)}</caption>" if lines else ""
        return f"<table class='scores'>{caption}<tr>{head}</tr>{rows}</table>"

    def _columns(self) -> list[str]:
        return ["method", *(headed(m) for m in self.metrics), "mean rank ↓", "seconds"]

    def _rows(self) -> list[list[str]]:
        """Each method's cells: mean ± standard error per metric, mean rank, seconds."""
        mean, sem, ranks = self.mean, self.sem, self.mean_ranks()
        return [
            [method, *(_mean_cell(mean[i, j], sem[i, j]) for j in range(len(self.metrics))),
             _cell(ranks[i], 1), _cell(self.seconds[i], 2)]
            for i, method in enumerate(self.methods)
        ]  # fmt: skip

    def _footnotes(self) -> list[str]:
        """The notes on skipped methods and images, and the settings."""
        notes = "; ".join(f"{name}: {note}" for name, note in self.notes.items())
        return [line for line in (notes, self.settings()) if line]


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


def _mean_cell(mean: Tensor, sem: Tensor) -> str:
    """ "0.412 ± 0.031", "0.412" without a standard error, "n/a" without a mean."""
    mean, sem = float(mean), float(sem)
    return _cell(mean, 3) + ("" if math.isnan(mean) or math.isnan(sem) else f" ± {sem:.3f}")
