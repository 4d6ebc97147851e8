"""Figures of the mechanistic views: direct logit attribution by part and by head, the logit
lens over the patches per layer, and activation patching as layer x position and layer x head
maps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..analysis.logit_attribution import LogitAttribution
from ..analysis.logit_lens import LogitLens
from ..analysis.patching import PatchingResult
from .overlay import photo
from .style import SALIENCY_SCALE, finish, map_axes, square_cells, step_slider

__all__ = ["logit_attribution_figure", "logit_lens_maps", "patching_maps"]

DIVERGING = "RdBu"  # signed contributions: red lowers, blue raises the score; white is 0
PART_COLOURS = {"embed": "#7f7f7f", "attn": "#1f77b4", "mlp": "#ff7f0e"}  # bars of each part


def _images(index: int | None, batch: int) -> tuple[slice, str]:
    """The images a figure averages over, and how its title says so."""
    if index is None:
        return slice(None), f"mean over {batch} images"
    if not 0 <= index < batch:
        raise IndexError(f"image must be in [0, {batch}); got {index}.")
    return slice(index, index + 1), f"image {index}"


def _class(index: int, classes: Sequence[str] | None) -> str:
    return classes[index] if classes is not None else f"class {index}"


def _score_name(
    targets: torch.Tensor, versus: torch.Tensor | None, images: slice,
    classes: Sequence[str] | None,
) -> str:  # fmt: skip
    chosen = sorted(set(targets[images].tolist()))
    name = (f"logit of {_class(chosen[0], classes)}" if len(chosen) == 1
            else "logit of the class explained")  # fmt: skip
    if versus is not None:
        others = sorted(set(versus[images].tolist()))
        name += f" − {_class(others[0], classes)}" if len(others) == 1 else " − the versus class"
    return name


def _symmetric(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0


def logit_attribution_figure(
    result: LogitAttribution, image: int | None = None, classes: Sequence[str] | None = None
) -> go.Figure:
    """Each part's direct contribution as bars (embedding, then each block's attention and MLP
    outputs) and, where the heads split, each head's as a layer x head map; one image or the
    mean over the batch; ``classes`` name the classes."""
    chosen, over = _images(image, len(result.score))
    values = result.contributions[chosen].mean(0).cpu().numpy()
    heads = result.heads is not None
    fig = make_subplots(
        rows=1, cols=2 if heads else 1, column_widths=[0.6, 0.4] if heads else None,
        subplot_titles=["each part of the stream", "each head (its share of attn)"][: 1 + heads],
        horizontal_spacing=0.12,
    )  # fmt: skip
    colours = [PART_COLOURS["embed"]] + [
        PART_COLOURS["attn" if "attn" in p else "mlp"] for p in result.parts[1:]]  # fmt: skip
    fig.add_trace(
        go.Bar(x=result.parts, y=values, marker_color=colours, showlegend=False,
               hovertemplate="%{x}: %{y:.3f}<extra></extra>"),
        row=1, col=1,
    )  # fmt: skip
    fig.update_yaxes(title_text="direct contribution", row=1, col=1)
    fig.update_xaxes(tickangle=-45, row=1, col=1)
    if heads:
        grid = result.heads[chosen].mean(0).cpu().numpy()  # (L, H)
        top = _symmetric(grid)
        fig.add_trace(
            go.Heatmap(
                z=grid, x=[f"head {h}" for h in range(grid.shape[1])], y=result.blocks,
                colorscale=DIVERGING, zmid=0, zmin=-top, zmax=top,
                colorbar={"title": "direct<br>contribution", "x": 1.02},
                hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>",
            ),
            row=1, col=2,
        )  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=1, col=2)
        square_cells(fig)
    score = float(result.score[chosen].mean())
    constant = float(result.constant[chosen].mean())
    explained = _score_name(result.targets, result.versus, chosen, classes)
    title = (
        f"Direct logit attribution, {over}: {explained} = {score:.3f}<br><sup>parts sum to "
        f"it with the head's constant {constant:.3f}; the final norm's scale frozen at its "
        "clean value</sup>"
    )
    return finish(fig, title, 460)


def logit_lens_maps(
    lens: LogitLens, images: np.ndarray, image: int = 0, target: int | None = None,
    classes: Sequence[str] | None = None, layer: int | None = None,
) -> go.Figure:  # fmt: skip
    """The probability of ``target`` (default: the model's class) read off each patch after
    each layer, one layer at a time on a slider, the image (B, H, W, 3) uint8 beside it; the
    slider names each layer with the pooled reading's probability; ``classes`` name the
    classes; ``layer`` (an index of ``lens.layers``): that layer alone, without a slider."""
    _, over = _images(image, len(lens.predictions))
    cls = int(lens.predictions[image]) if target is None else int(target)
    maps = lens.maps(cls)[image].cpu().numpy()  # (L + 1, gh, gw)
    pooled = lens.pooled[image].softmax(-1)[:, cls].cpu().numpy()
    fig = make_subplots(rows=1, cols=2, subplot_titles=["image", "per patch"],
                        horizontal_spacing=0.05)  # fmt: skip
    shown = range(len(lens.layers)) if layer is None else [layer]
    for index in shown:
        name = lens.layers[index]
        fig.add_trace(photo(images[image], hoverinfo="skip"), row=1, col=1)
        fig.add_trace(
            go.Heatmap(
                z=maps[index], coloraxis="coloraxis",
                hovertemplate=f"{name}, patch (row %{{y}}, col %{{x}}): %{{z:.3f}}<extra></extra>",
            ),
            row=1, col=2,
        )  # fmt: skip
    labels = [f"{name} (pooled {p:.2f})" for name, p in zip(lens.layers, pooled, strict=True)]
    if layer is None:
        step_slider(fig, labels, per_step=2, active=len(lens.layers) - 1, prefix="after ")
    else:
        fig.layout.annotations[1].text = f"per patch after {labels[layer]}"
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1,
                                 "colorbar": {"title": f"p({_class(cls, classes)})"}})  # fmt: skip
    first = int(lens.first_decodable()[image])
    title = (
        f"Logit lens, {over}: the head on each patch, probability of {_class(cls, classes)}"
        f"<br><sup>the pooled reading settles on the model's class after "
        f"{lens.layers[first]}</sup>"
    )
    return finish(fig, title, 520)


def patching_maps(result: PatchingResult, image: int | None = None) -> go.Figure:
    """The restored share of the clean score per patched site: the stream entering each block
    per position (layers x positions) and the embedded tokens (the first block's, per position)
    as full-width rows stacked on one position axis, under them each head (layers x heads) and
    each block's attention and MLP output (bars); one image or the mean over the batch. Rows are
    sized in pixels, so titles keep clear of each other at any width."""
    chosen, over = _images(image, len(result.clean_score))
    high = result.clean_score[chosen].mean()
    low = result.corrupted_score[chosen].mean()

    def restored(site: str) -> np.ndarray | None:  # the share of the mean scores (a mean of
        if getattr(result, site) is None:  # per-image shares is ruled by the smallest gaps)
            return None
        share = (result.scores[site][chosen].mean(0) - low) / (high - low)
        return (share[None] if site == "positions" else share).cpu().numpy()  # 2-D maps

    tokens = [(n, v) for n in ("resid", "positions") if (v := restored(n)) is not None]
    heads = restored("heads")
    bars = [(n, restored(n)) for n in ("attn", "mlp") if getattr(result, n) is not None]
    if not (tokens or heads is not None or bars):
        raise ValueError("The result holds no patched site.")
    cols = (heads is not None) + bool(bars)  # the bottom row: heads and bars side by side
    titles = {
        "resid": "resid: the stream entering each block, per position",
        "positions": f"positions: the embedded tokens (entering {result.blocks[0]})",
        "heads": "heads: each head's output",
        "bars": f"{', '.join(n for n, _ in bars)}: each block's output",
    }
    shown = [n for n, _ in tokens] + ["heads"] * (heads is not None) + ["bars"] * bool(bars)
    fig = make_subplots(
        rows=len(tokens) + bool(cols), cols=max(cols, 1), horizontal_spacing=0.14,
        specs=[[{"colspan": max(cols, 1)}] + [None] * (cols - 1) for _ in tokens]
        + [[{}] * cols] * bool(cols),
        subplot_titles=[titles[n] for n in shown],
    )  # fmt: skip
    prefix = result.layout.num_prefix_tokens if result.layout else 0
    for row, (_, grid) in enumerate(tokens, start=1):
        x = [f"prefix {p}" for p in range(prefix)] + [
            f"patch {p}" for p in range(grid.shape[1] - prefix)]  # fmt: skip
        rows = result.blocks[: len(grid)]
        fig.add_trace(
            go.Heatmap(z=grid, x=x, y=rows, coloraxis="coloraxis",
                       hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>"),
            row=row, col=1,
        )  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=row, col=1)
        fig.update_xaxes(showticklabels=False, row=row, col=1)
        if row > 1:  # one position axis: zooming one row zooms both
            fig.update_xaxes(matches="x", row=row, col=1)
    if tokens:
        n = tokens[0][1].shape[1]
        grid = result.layout.grid if result.layout else None
        fig.update_xaxes(
            title_text=(f"position: {prefix} prefix token{'s' * (prefix != 1)}, then "
                        f"{grid[0]}×{grid[1]} patches row by row (hover names each)")
            if grid else f"position ({n} tokens; hover names each)",
            title_standoff=4, row=len(tokens), col=1,
        )  # fmt: skip
    bottom = len(tokens) + 1
    if heads is not None:
        names = [f"head {h}" for h in range(heads.shape[1])]
        fig.add_trace(
            go.Heatmap(z=heads, x=names, y=result.blocks, coloraxis="coloraxis",
                       hovertemplate="%{y}, %{x}: %{z:.3f}<extra></extra>"),
            row=bottom, col=1,
        )  # fmt: skip
        axis = fig.get_subplot(bottom, 1).xaxis.plotly_name.replace("axis", "")
        fig.update_yaxes(autorange="reversed", scaleanchor=axis, constrain="domain",
                         row=bottom, col=1)  # square cells  # fmt: skip
        fig.update_xaxes(constrain="domain", title_text="head", title_standoff=4,
                         tickvals=names, ticktext=[str(h) for h in range(len(names))],
                         row=bottom, col=1)  # fmt: skip
    for name, values in bars:
        fig.add_trace(
            go.Bar(x=result.blocks, y=values, name=name, marker_color=PART_COLOURS[name],
                   hovertemplate=f"{name} %{{x}}: %{{y:.3f}}<extra></extra>"),
            row=bottom, col=cols,
        )  # fmt: skip
    if bars:
        fig.update_yaxes(title_text="restored share", row=bottom, col=cols)
    if cols:
        fig.update_xaxes(automargin=True, row=bottom)
    # rows in pixels, top to bottom: each under its title, the position axis title under the
    # last token row
    heights = [min(max(22 * len(v), 80), 300) if n == "resid" else 34 for n, v in tokens]
    heights += [max(220, min(22 * len(result.blocks), 320))] * bool(cols)
    above = [0] + [40] * (len(heights) - 1)  # a subplot title over each row but the first
    if tokens and cols:
        above[len(tokens)] += 30  # the position axis title
    legend = 70 if bars else 0  # the legend at the bottom right, the colour bar above it
    plot = max(sum(heights) + sum(above), 150 + legend)  # room for the colour bar
    top = 0
    for row, (height, gap) in enumerate(zip(heights, above, strict=True), start=1):
        top += gap
        for col in range(1, (cols if row == bottom else 1) + 1):
            fig.get_subplot(row, col).yaxis.domain = (1 - (top + height) / plot, 1 - top / plot)
        top += height
    for note, name in zip(fig.layout.annotations, shown, strict=True):
        row = bottom if name in ("heads", "bars") else 1 + [n for n, _ in tokens].index(name)
        note.y = fig.get_subplot(row, 1).yaxis.domain[1]
    fig.update_layout(
        coloraxis={"colorscale": DIVERGING, "cmid": 0, "colorbar": {
            "title": "restored<br>share", "y": 1, "yanchor": "top", "len": 1 - legend / plot}},
        barmode="group",
        legend={"x": 1.02, "xanchor": "left", "y": 0, "yanchor": "bottom"},
    )  # fmt: skip
    title = (
        f"Activation patching, {over}: share of the clean score restored"
        f"<br><sup>(patched − corrupted) / (clean − corrupted) of the mean scores; clean − "
        f"corrupted = {float(high - low):.3f}; 1: that activation alone restores it</sup>"
    )
    finish(fig, title)
    margin = fig.layout.margin
    below = 60 if cols else 50  # the bottom row's tick labels and axis titles
    fig.update_layout(height=margin.t + plot + below, margin_b=below)
    return fig
