"""Figures of the metrics over data: which method wins per metric (`vk.evaluate`'s table, with
standard errors) and the perturbation curves of several methods (deletion, insertion, ROAD's
MoRF and LeRF) with their areas."""

from __future__ import annotations

import math
from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..metrics.evaluate import EVALUATION_METRICS, EvaluationTable
from ..metrics.faithfulness import CurveResult
from .style import finish

__all__ = ["curve_comparison", "evaluation_bars"]

PER_ROW = 4
_CURVES = {
    "deletion": "deletion: most salient first removed",
    "insertion": "insertion: most salient first revealed",
    "road_morf": "ROAD MoRF: most relevant first removed and imputed",
    "road_lerf": "ROAD LeRF: least relevant first removed and imputed",
}


def evaluation_bars(table: EvaluationTable) -> go.Figure:
    """One panel per metric: each method's mean with its standard error, a colour per method
    across panels; each panel's title says which way is better and which method is best."""
    rows = math.ceil(len(table.metrics) / PER_ROW)
    titles = []
    for metric in table.metrics:
        arrow = "↑" if EVALUATION_METRICS[metric].higher else "↓"
        titles.append(f"{metric} {arrow}<br>best: {table.best(metric)}")
    fig = make_subplots(rows=rows, cols=min(PER_ROW, len(table.metrics)),
                        subplot_titles=titles, vertical_spacing=0.5 / rows)  # fmt: skip
    colors = {m: qualitative.Plotly[i % 10] for i, m in enumerate(table.methods)}
    for j in range(len(table.metrics)):
        row, col = divmod(j, PER_ROW)
        fig.add_trace(
            go.Bar(
                x=table.methods, y=table.mean[:, j].tolist(),
                error_y={"type": "data", "array": table.sem[:, j].nan_to_num().tolist()},
                marker_color=[colors[m] for m in table.methods], showlegend=False,
                hovertemplate="%{x}: %{y:.3f}<extra></extra>",
            ),
            row=row + 1, col=col + 1,
        )  # fmt: skip
        fig.update_yaxes(title_text="mean ± SE", row=row + 1, col=col + 1)
    images = table.per_image.shape[-1]
    title = f"Saliency methods over {images} images: mean and standard error per metric"
    return finish(fig, title, 330 * rows + 90)


def curve_comparison(curves: Mapping[str, CurveResult]) -> go.Figure:
    """The mean curve of each method (``curves``: method name -> one kind of `CurveResult`)
    with a band of one standard error, its mean area in the legend."""
    kinds = {c.kind for c in curves.values()}
    if len(kinds) != 1:
        raise ValueError(f"curves must be of one kind; got {sorted(kinds)}.")
    kind = kinds.pop()
    fig = go.Figure()
    for i, (name, curve) in enumerate(curves.items()):
        color = qualitative.Plotly[i % 10]
        x = curve.fractions.tolist()
        mean = curve.scores.mean(0)
        error = curve.scores.std(0) / max(1, len(curve.scores)) ** 0.5
        band = (mean + error).tolist() + (mean - error).flip(0).tolist()
        fig.add_trace(go.Scatter(x=x + x[::-1], y=band, mode="lines", fill="toself",
                                 line={"width": 0},
                                 fillcolor=color, opacity=0.2, hoverinfo="skip",
                                 showlegend=False))  # fmt: skip
        fig.add_trace(go.Scatter(x=x, y=mean.tolist(), mode="lines+markers", line={"color": color},
                                 name=f"{name} (area {curve.auc.mean():.3f})"))  # fmt: skip
    fig.update_xaxes(title="share of the image removed" if kind != "insertion"
                     else "share of the image revealed", range=[0, 1])  # fmt: skip
    fig.update_yaxes(title="probability of the class explained", range=[0, 1.02])
    return finish(fig, _CURVES.get(kind, kind) + " (mean, band: standard error)", 430)
