"""A circuit drawn as a graph: the embedding, each block's heads (or attention) and MLP, and the
output as columns in stream order; nodes sized by their effect, edges by theirs."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from torch import Tensor

from ..circuits import AttributionResult, Circuit, FaithfulnessCurve, circuit
from .style import finish

__all__ = ["circuit_figure", "faithfulness_figure", "graph_axes", "graph_traces"]

POSITIVE, NEGATIVE, NONE = "#2166ac", "#b2182b", "#999999"  # raises the score, lowers it, 0
FADED = "#e0e0e0"  # a node outside the circuit drawn
LARGEST_MARKER, LARGEST_LINE = 34, 9  # pixels, for the largest effect drawn
WIDTH_LEVELS = 6  # the widths edges are drawn in


def circuit_figure(found: AttributionResult | Circuit, edges: int = 30) -> go.Figure:
    """The graph of ``found``: an `AttributionResult` (its ``edges`` largest mean edge effects by
    magnitude drawn, nodes sized by their mean effect) or a `Circuit` (its edges, nodes sized by
    the sum of their edges' scores). Edges bow upwards from a node (circle) to the input it
    feeds (triangle); blue raises the score, red lowers it; hover for names and values."""
    if isinstance(found, AttributionResult):
        count = int((~found.edges[0].isnan()).sum())
        top = circuit(found, min(edges, count))
        scores, kept, nodes = top.scores, top.edges, found.nodes.mean(0)
        what = f"the {len(top)} largest of {count} edges"
    else:
        scores, kept, nodes = found.scores, found.edges, found.node_effects()
        what = f"{len(found)} edges"
    measured = "sized by mean effect on the score: blue raises it, red lowers it"
    if found.options.get("method") == "acdc":  # its scores: how much a removal worsened it
        metric = {"kl": "KL divergence", "score": "score's distance"}[found.options["metric"]]
        measured = (f"ACDC, threshold {found.options['threshold']:g}: sized by how much "
                    f"removing each raised the {metric} from the model")  # fmt: skip
    traces, ticks = graph_traces(found.upstream, found.downstream, scores, kept, nodes)
    fig = go.Figure(traces)
    graph_axes(fig, ticks)
    title = f"Circuit: {what}<br><sup>{measured}</sup>"
    return finish(fig, title, 480)


def graph_traces(
    upstream: list[str], downstream: list[str], scores: Tensor, kept: Tensor, nodes: Tensor,
    faded: Tensor | None = None,
) -> tuple[list[go.Scatter], dict[float, str]]:  # fmt: skip
    """The traces of a component graph and its columns' labels: the ``kept`` ((U, D) bool)
    edges as arcs whose width follows |``scores``| (U, D), in `WIDTH_LEVELS` widths per colour
    (a trace each, so thousands of edges stay a dozen traces); each input a triangle; each node
    a circle whose area follows its effect ``nodes`` (U,), pale where ``faded`` ((U,) bool).
    The nodes' trace (named "nodes") is the last, its points in node order."""
    places, inputs, ticks = _layout(upstream, downstream)
    pairs = kept.nonzero().tolist()
    scale = max((abs(float(scores[u, d])) for u, d in pairs), default=0.0) or 1.0
    groups: dict[tuple[int, str], tuple[list, list, list]] = {}
    for u, d in pairs:
        value = float(scores[u, d])
        level = min(WIDTH_LEVELS, max(1, math.ceil(WIDTH_LEVELS * abs(value) / scale)))
        xs, ys, text = groups.setdefault((level, _colour(value)), ([], [], []))
        arc_x, arc_y = _arc(places[u], inputs[d])
        xs += [*arc_x, None]
        ys += [*arc_y, None]
        text += [f"{upstream[u]} → {downstream[d]}: {value:+.3g}"] * len(arc_x) + [None]
    traces = [
        go.Scatter(x=xs, y=ys, mode="lines", showlegend=False, opacity=0.6, hoverinfo="text",
                   line={"width": max(1.0, LARGEST_LINE * level / WIDTH_LEVELS), "color": colour},
                   text=text)
        for (level, colour), (xs, ys, text) in sorted(groups.items())
    ]  # fmt: skip
    traces.append(go.Scatter(
        x=[p[0] for p in inputs], y=[p[1] for p in inputs], mode="markers", showlegend=False,
        marker={"size": 7, "symbol": "triangle-right", "color": "#333"}, hoverinfo="text",
        text=list(downstream),
    ))  # fmt: skip
    area = (nodes.abs() / nodes.abs().max().clamp_min(1e-12)).sqrt()  # of the largest's
    pale = [False] * len(upstream) if faded is None else faded.tolist()
    traces.append(go.Scatter(
        x=[p[0] for p in places], y=[p[1] for p in places], mode="markers", showlegend=False,
        name="nodes", marker={"size": (6 + (LARGEST_MARKER - 6) * area).tolist(),
                "color": [FADED if off else _colour(v) for v, off in zip(nodes.tolist(), pale,
                                                                         strict=True)],
                "line": {"width": 1, "color": "#333"}},
        hovertemplate="%{text}<extra></extra>",
        text=[f"{name}: {float(v):+.3g}" for name, v in zip(upstream, nodes, strict=True)],
    ))  # fmt: skip
    return traces, ticks


def graph_axes(fig: go.Figure, ticks: dict[float, str], **where: int) -> None:
    """The axes of a graph drawn by `graph_traces` (``where``: row and col of a subplot)."""
    fig.update_xaxes(tickvals=list(ticks), ticktext=list(ticks.values()), tickangle=-45,
                     showgrid=False, zeroline=False, title_text="stream order",
                     **where)  # fmt: skip
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False,
                     title_text="a block's heads", **where)  # fmt: skip


def _colour(value: float) -> str:
    return POSITIVE if value > 0 else NEGATIVE if value < 0 else NONE


def _arc(start: tuple[float, float], end: tuple[float, float]) -> tuple[list, list]:
    """Points of a quadratic curve from ``start`` to ``end`` bowed up by a share of its length,
    so edges between the same rows do not lie on one another."""
    (x0, y0), (x1, y1) = start, end
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2 + 0.12 * (x1 - x0)
    steps = [i / 16 for i in range(17)]
    xs = [(1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1 for t in steps]
    ys = [(1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1 for t in steps]
    return xs, ys


def _layout(
    upstream: list[str], downstream: list[str]
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], dict[float, str]]:
    """Where each node and each input is drawn, and the columns' labels: column 0 the
    embedding, then each block's attention (heads stacked) and MLP, then the output; an input
    sits just left of the column it feeds."""
    places: list[tuple[float, float]] = []
    ticks: dict[float, str] = {0.0: "embed"}
    heads: dict[str, list[int]] = {}
    layers: dict[str, int] = {}  # block path -> its place in the stream
    for u, name in enumerate(upstream):
        if name == "embed":
            places.append((0.0, 0.0))
            continue
        block, kind = name.split(" ", 1)
        layer = layers.setdefault(block, len(layers))
        column = float(2 * layer + (2 if kind == "mlp" else 1))
        ticks[column] = f"{'mlp' if kind == 'mlp' else 'attn'} {layer}"
        if kind.startswith("head"):
            heads.setdefault(block, []).append(u)
        places.append((column, 0.0))
    for rows in heads.values():  # a block's heads stacked around the middle
        for i, u in enumerate(rows):
            places[u] = (places[u][0], i - (len(rows) - 1) / 2)
    inputs = []
    for d, name in enumerate(downstream):
        column = float(d + 1) if name != "output" else float(len(downstream))
        inputs.append((column - (0.3 if name != "output" else 0.0), 0.0))
    ticks[float(len(downstream))] = "output"
    return places, inputs, ticks


def faithfulness_figure(curves: dict[str, FaithfulnessCurve]) -> go.Figure:
    """Faithfulness against the share of edges kept, one curve per name (a scoring method),
    with each curve's CPR (area under it) and CMD (area between it and 1) in its legend."""
    fig = go.Figure()
    for name, curve in curves.items():
        fig.add_trace(go.Scatter(
            x=(100 * curve.share).tolist(), y=curve.faithfulness.tolist(), mode="lines+markers",
            name=f"{name} (CPR {curve.cpr:.2f}, CMD {curve.cmd:.2f})",
            text=[f"{int(s)} edges" for s in curve.sizes],
            hovertemplate="%{text}: %{y:.3f}<extra></extra>",
        ))  # fmt: skip
    fig.add_hline(y=1, line={"dash": "dot", "color": "#999999"})
    fig.update_xaxes(title_text="edges kept (% of the graph's)")
    fig.update_yaxes(title_text="faithfulness (share of the score recovered)")
    return finish(fig, "Circuits of growing size: how much of the model's score they recover", 420)
