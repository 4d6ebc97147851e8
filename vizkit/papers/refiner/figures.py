"""Refiner figures: one refiner's maps stage by stage (Fig. 3), its learned weights, N x N
attention matrices of several models and depths (Fig. 5), attention statistics against depth,
accuracy over seeds (Table 1 / Fig. 6 sweeps) and accuracy against the test crop ratio (RFC)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ...analysis import AttentionResult
from ...hooks.selector import LayerSpec
from ...viz.style import ATTENTION_SCALE, MASK_SCALE, finish, map_axes, palette
from .analysis import RefinerStages

__all__ = [
    "attention_depth_curves",
    "attention_matrices",
    "crop_ratio_curves",
    "refiner_stages_figure",
    "refiner_weights_figure",
]

_STAGE_TITLES = {  # row labels; the title says what each stage is
    "softmax": "softmax A",
    "expanded": "expanded",
    "local": "convolved",
    "refined": "reduced",
}


def _signed_heatmap(z: Tensor, coloraxis: str = "coloraxis") -> go.Heatmap:
    return go.Heatmap(z=z.float().cpu().numpy(), coloraxis=coloraxis)


def refiner_stages_figure(stages: RefinerStages, image: int = 0) -> go.Figure:
    """Fig. 3 on data: one row per stage (softmax, expanded, convolved, reduced), one N x N map
    per head or expanded map; signed colours centred at 0 (refined maps can be negative)."""
    if not 0 <= image < len(stages.maps["softmax"]):
        raise ValueError(f"image {image} is out of range 0..{len(stages.maps['softmax']) - 1}.")
    columns = max(m.shape[1] for m in stages.maps.values())
    fig = make_subplots(
        rows=4, cols=columns, horizontal_spacing=0.01, vertical_spacing=0.05,
        row_titles=list(_STAGE_TITLES.values()),
    )  # fmt: skip
    values = []
    for row, stage in enumerate(_STAGE_TITLES, start=1):
        maps = stages.maps[stage][image]
        values.append(maps.detach().float().abs().flatten())
        for col in range(maps.shape[0]):
            fig.add_trace(_signed_heatmap(maps[col]), row=row, col=col + 1)
    map_axes(fig)
    top = max(torch.quantile(torch.cat(values), 0.99).item(), 1e-12)
    fig.update_layout(
        coloraxis={"colorscale": MASK_SCALE, "cmin": -top, "cmax": top,
                   "colorbar": {"title": "weight"}},
    )  # fmt: skip
    title = (
        f"Block {stages.layer}: the refiner stage by stage, image {image} (Refiner Fig. 3)<br><sup>"
        "rows: softmax maps A per head, expanded by W_A, each convolved by its k x k kernel, "
        f"reduced by W_R (the maps applied); colour ±{top:.3g} (99th percentile of |weight|)</sup>"
    )
    return finish(fig, title, 130 * 4 + 120)


def refiner_weights_figure(stages: RefinerStages) -> go.Figure:
    """The learned W_A (rH x H), the k x k kernels of the rH expanded maps and W_R (H x rH)."""
    if stages.kernels is None:
        raise ValueError("This refiner has row/column kernels (constraint='rowcol'), not k x k.")
    count = len(stages.kernels)
    cols = max(count, 6)
    expanded, heads = stages.expand.shape if stages.expand is not None else (count, count)
    first = [{"colspan": 2}, None, {"colspan": 4}, None, None, None] + [None] * (cols - 6)
    second = [{}] * count + [None] * (cols - count)
    titles = [f"W_A ({expanded} x {heads})", f"W_R ({heads} x {expanded})"]
    fig = make_subplots(
        rows=2,
        cols=cols,
        specs=[first, second],
        row_heights=[0.55, 0.45],
        subplot_titles=titles + [f"k{i}" for i in range(count)],
        horizontal_spacing=0.01,
        vertical_spacing=0.12,
    )  # fmt: skip (the mixing matrices above, one k x k kernel per expanded map below)
    for col, matrix in ((1, stages.expand), (3, stages.reduce)):
        if matrix is not None:
            fig.add_trace(_signed_heatmap(matrix), row=1, col=col)
    for col, kernel in enumerate(stages.kernels, start=1):
        fig.add_trace(_signed_heatmap(kernel), row=2, col=col)
    map_axes(fig)
    fig.update_layout(
        coloraxis={"colorscale": MASK_SCALE, "cmid": 0, "colorbar": {"title": "weight"}}
    )
    title = (
        f"Block {stages.layer}: learned refiner weights<br><sup>W_A mixes {heads} heads into "
        f"{expanded} maps, map i is convolved by kernel k_i (below), W_R mixes them back</sup>"
    )
    return finish(fig, title, 500)


def attention_matrices(
    results: Mapping[str, AttentionResult], layers: Sequence[LayerSpec], image: int = 0
) -> go.Figure:
    """Fig. 5: the full N x N matrix (heads averaged) of each model (rows) at each block
    (columns; each a captured layer as in `AttentionResult.position`). Softmax maps in viridis;
    signed (applied, refined) maps centred at 0."""
    first = next(iter(results.values()))
    fig = make_subplots(
        rows=len(results), cols=len(layers), row_titles=list(results),
        column_titles=[f"block {first.layers[first.position(i)]}" for i in layers],
        horizontal_spacing=0.01, vertical_spacing=0.04,
    )  # fmt: skip
    for row, result in enumerate(results.values(), start=1):
        for col, layer in enumerate(layers, start=1):
            matrix = result.heads()[result.position(layer), image]
            axis = "coloraxis2" if result.maps == "applied" else "coloraxis"
            fig.add_trace(_signed_heatmap(matrix, axis), row=row, col=col)
    map_axes(fig)
    fig.update_layout(
        coloraxis={"colorscale": ATTENTION_SCALE, "colorbar": {"x": 1.02, "len": 0.45, "y": 0.8}},
        coloraxis2={"colorscale": MASK_SCALE, "cmid": 0,
                    "colorbar": {"x": 1.02, "len": 0.45, "y": 0.2}},
    )  # fmt: skip
    return finish(fig, f"Attention matrices (query x key, heads averaged), image {image}",
                  170 * len(results) + 100)  # fmt: skip


DEPTH_STATS = {
    "entropy": "normalized entropy (1 = uniform)",
    "locality": "mass within 1 patch",
    "distance_pixels": "mean attention distance (pixels)",
    "distance_patches": "mean attention distance (patches)",
    "self_mass": "attention to itself",
}


def attention_depth_curves(
    stats: Mapping[str, Mapping[str, Tensor]],
    keys: Sequence[str] = ("entropy", "locality", "distance_pixels"),
    title: str = "Attention against depth (Refiner Fig. 5: less uniform, more local?)",
) -> go.Figure:
    """Attention statistics against depth, one curve per model: ``stats`` maps a label to
    `AttentionResult.stats()` (each (L, B, H), averaged over images and heads here); ``keys``
    picks the statistics (keys of `DEPTH_STATS`)."""
    if not stats:
        raise ValueError("stats is empty; pass {label: attention(model, x).stats()}.")
    unknown = set(keys) - set(DEPTH_STATS)
    if unknown:
        raise ValueError(f"Unknown statistics {sorted(unknown)}; known: {list(DEPTH_STATS)}.")
    fig = make_subplots(rows=1, cols=len(keys), horizontal_spacing=0.12)
    for i, (label, values) in enumerate(stats.items()):
        for col, key in enumerate(keys, start=1):
            per_layer = values[key].float().mean((1, 2)).cpu()
            fig.add_trace(
                go.Scatter(y=per_layer.tolist(), mode="lines+markers", name=label,
                           legendgroup=label, showlegend=col == 1, line={"color": palette(i)}),
                row=1, col=col,
            )  # fmt: skip
    fig.update_xaxes(title_text="block")
    for col, key in enumerate(keys, start=1):
        fig.update_yaxes(title_text=DEPTH_STATS[key], row=1, col=col)
    return finish(fig, title, 380)


def crop_ratio_curves(results: Mapping[str, Mapping[float, float]]) -> go.Figure:
    """Test accuracy against the test-time crop ratio (> 1: padded, RFC), one curve per model."""
    fig = go.Figure()
    for i, (label, accuracy) in enumerate(results.items()):
        fig.add_trace(
            go.Scatter(x=list(accuracy), y=list(accuracy.values()), mode="lines+markers",
                       name=label, line={"color": palette(i)})
        )  # fmt: skip
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_xaxes(title_text="crop ratio (< 1: centre crop, > 1: zero padding)")
    fig.update_yaxes(title_text="test accuracy", tickformat=".0%")
    return finish(fig, "Receptive Field Calibration (Refiner Table 5)", 380)
