"""Figures of the metrics over data: which method wins per metric (`vk.evaluate`'s table, with
standard errors) and the perturbation curves of several methods (deletion, insertion, ROAD's
MoRF and LeRF) with their areas."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..metrics.faithfulness import CurveResult
from ..metrics.registry import METRICS, headed
from ..metrics.table import SaliencyTable
from .style import finish, method_color

__all__ = ["curve_comparison", "evaluation_bars"]

PER_ROW = 4
# two lines each: side by side at 900 px, one line would run into the next panel's
_CURVES = {
    "deletion": "deletion:<br>most salient first removed",
    "deletion_lerf": "deletion LeRF:<br>least salient first removed",
    "insertion": "insertion:<br>most salient first revealed",
    "road_morf": "ROAD MoRF: most relevant<br>first removed and imputed",
    "road_lerf": "ROAD LeRF: least relevant<br>first removed and imputed",
}


def evaluation_bars(table: SaliencyTable, per_row: int = PER_ROW) -> go.Figure:
    """One panel per metric, ``per_row`` to a row: each method's mean with its standard
    error, a colour per method across panels; each panel's title says which way is better and
    which method is best (none where every prediction is near chance and the metric perturbs
    the images: `SaliencyTable.caution`, which the title then states)."""
    rows = math.ceil(len(table.metrics) / per_row)
    titles = [f"{headed(metric)}<br>{_best(table, metric)}" for metric in table.metrics]
    fig = make_subplots(rows=rows, cols=min(per_row, len(table.metrics)),
                        subplot_titles=titles, vertical_spacing=0.5 / rows)  # fmt: skip
    for j in range(len(table.metrics)):
        row, col = divmod(j, per_row)
        fig.add_trace(
            go.Bar(
                x=table.methods, y=table.mean[:, j].tolist(),
                error_y={"type": "data", "array": table.sem[:, j].nan_to_num().tolist()},
                marker_color=[method_color(m) for m in table.methods], showlegend=False,
                hovertemplate="%{x}: %{y:.3f}<extra></extra>",
            ),
            row=row + 1, col=col + 1,
        )  # fmt: skip
        if col == 0:  # beside the first panel of a row only: it would run into the one before
            fig.update_yaxes(title_text="mean ± SE", row=row + 1, col=1)
    images = table.per_image.shape[-1]
    title = f"Saliency methods over {images} images: mean and standard error per metric"
    which = table.near_chance_images()
    if which:
        unranked = any(not table.ranked(m) for m in table.metrics if m in METRICS)
        said = f"{which}: curves not ranked" if unranked else which
        title += f"<br><span style='color:#b2182b'>⚠ {said}</span>"
    return finish(fig, title, 330 * rows + 90)


def _best(table: SaliencyTable, metric: str) -> str:
    """ "best: method", or why the metric ranks nothing (`SaliencyTable.ranked`)."""
    if metric not in METRICS:
        return "not ranked: unregistered"
    if not table.ranked(metric):
        return "not ranked: near chance"
    return f"best: {table.best(metric)}"


def curve_comparison(curves: Mapping[str, CurveResult | Sequence[CurveResult]]) -> go.Figure:
    """The mean curve of each method with a band of one standard error and its mean area in
    the legend; ``curves``: method name -> a `CurveResult` or several of different kinds (say
    ROAD MoRF and LeRF), each method the same kinds. One panel per kind, a colour per method."""
    per_method = {name: [c] if isinstance(c, CurveResult) else list(c)
                  for name, c in curves.items()}  # fmt: skip
    kinds = [[c.kind for c in chosen] for chosen in per_method.values()]
    if not kinds or any(k != kinds[0] or len(set(k)) != len(k) for k in kinds):
        raise ValueError(
            "curves must give every method the same kinds of curve, each once (one panel per "
            f"kind); got {dict(zip(per_method, kinds, strict=True))}."
        )
    titles = [_CURVES.get(kind, kind) for kind in kinds[0]]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles if len(titles) > 1
                        else None, horizontal_spacing=0.08)  # fmt: skip
    for name, chosen in per_method.items():
        color = method_color(name)
        for col, curve in enumerate(chosen, start=1):
            x = curve.fractions.tolist()
            mean = curve.scores.mean(0)
            count = len(curve.scores)  # one image: no band
            error = curve.scores.std(0, correction=int(count > 1)) / count**0.5
            band = (mean + error).tolist() + (mean - error).flip(0).tolist()
            fig.add_trace(go.Scatter(x=x + x[::-1], y=band, mode="lines", fill="toself",
                                     line={"width": 0}, fillcolor=color, opacity=0.2,
                                     hoverinfo="skip", showlegend=False),
                          row=1, col=col)  # fmt: skip
            areas = ", ".join(f"{c.auc.mean():.3f}" for c in chosen)
            fig.add_trace(go.Scatter(x=x, y=mean.tolist(), mode="lines+markers",
                                     line={"color": color}, legendgroup=name,
                                     name=f"{name} (area{'s' * (len(chosen) > 1)} {areas})",
                                     showlegend=col == 1),
                          row=1, col=col)  # fmt: skip
            revealed = curve.kind == "insertion"
            fig.update_xaxes(title="share of the image " + ("revealed" if revealed else "removed"),
                             range=[0, 1], row=1, col=col)  # fmt: skip
            if curve.targets is not None:  # a probability (a score target's score has no range)
                fig.update_yaxes(range=[0, 1.02], row=1, col=col)
    first = next(iter(per_method.values()))[0]
    scored = "probability of the class explained" if first.targets is not None else "target score"
    fig.update_yaxes(title=scored, row=1, col=1)
    images = len(next(iter(per_method.values()))[0].scores)
    title = titles[0].replace("<br>", " ") if len(titles) == 1 else "Perturbation curves"
    over = f"mean over {images} images, band: standard error" if images > 1 else "1 image"
    return finish(fig, f"{title} ({over})", 430)
