"""Figure lint over every report section of the shipped ViT, CaiT and ResNet: each figure has a
title, square cells for square maps and image overlays (in every subplot, not only the first),
a colour bar wherever colour carries a value, axis titles on curves, and no label that
contradicts the model (LayerScale where there is none)."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from vizkit.report.inputs import load_inputs
from vizkit.report.sections import SECTIONS, NotApplicable


def report_figures(model: str) -> list[tuple[str, go.Figure]]:
    inputs = load_inputs(model, n=2)
    figures = []
    for name, build in SECTIONS.items():
        try:
            section = build(inputs)
        except NotApplicable:
            continue
        figures += [(f"{name}[{i}]", fig) for i, fig in enumerate(section.figures)]
    return figures


FIGURES = {model: report_figures(model) for model in ("vit_tiny_shapes", "cait_tiny_shapes")}
ALL = [(m, name, fig) for m, figures in FIGURES.items() for name, fig in figures]


def _is_square_map(trace) -> bool:
    """An image, or a heatmap whose grid is square (a patch map, a CKA matrix)."""
    if isinstance(trace, go.Image):
        return True
    if not isinstance(trace, go.Heatmap) or trace.z is None:
        return False
    rows = len(trace.z)
    return rows > 1 and rows == len(trace.z[0])


@pytest.mark.parametrize("model, name, fig", ALL, ids=[f"{m}-{n}" for m, n, _ in ALL])
def test_report_figure_lint(model, name, fig):
    assert (fig.layout.title.text or "").strip(), "no title"
    with_image = {(t.xaxis or "x", t.yaxis or "y") for t in fig.data if isinstance(t, go.Image)}
    for trace in fig.data:  # plotly keeps an image's pixels square (and a map laid over it)
        x, y = trace.xaxis or "x", trace.yaxis or "y"
        if _is_square_map(trace) and (x, y) not in with_image:
            assert fig.layout["yaxis" + y[1:]].scaleanchor == x, f"cells not square on {y}"
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    if heatmaps:
        shared = [t for t in heatmaps if t.coloraxis]
        own = [t for t in heatmaps if not t.coloraxis]
        assert not shared or fig.layout.coloraxis.showscale is not False, "no colour bar"
        assert not own or any(t.showscale is not False for t in own), "no colour bar"
    if any(isinstance(t, go.Scatter) and t.mode != "markers" for t in fig.data):
        x_titles = [fig.layout[k].title.text for k in fig.layout if k.startswith("xaxis")]
        y_titles = [fig.layout[k].title.text for k in fig.layout if k.startswith("yaxis")]
        assert any(x_titles) and any(y_titles), "a curve without axis titles"
    if model == "vit_tiny_shapes":  # no LayerScale in this model
        texts = [fig.layout.title.text] + [a.text for a in fig.layout.annotations or ()]
        assert not any("with LayerScale" in (t or "") for t in texts)


def test_the_lint_sees_every_kind_of_section():
    names = {name.split("[")[0] for _, name, _ in ALL}
    assert {"predictions", "attention", "rollout", "saliency", "representations"} <= names
    assert "residual_ratios" in names and "class_attention" in names
