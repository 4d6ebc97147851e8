"""Attention figures: layers x heads small multiples, and one query's row over the image."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..analysis import AttentionResult, Stages
from ..analysis import attention_stats as stats
from ..hooks import TokenLayout
from ..hooks.heads import HeadSpec
from ..hooks.inputs import check_choice
from ..hooks.selector import LayerSpec
from .overlay import heatmap_on_image, opacity_slider, photo
from .style import ATTENTION_SCALE, finish, map_axes, min_max_scaled

__all__ = [
    "attention_grid", "attention_stats_figure", "centre_patch", "default_query", "query_attention",
]  # fmt: skip


def default_query(result: AttentionResult) -> str | tuple[int, ...]:
    """The class token when there is one, else the centre patch (`centre_patch`)."""
    if result.layout.class_token and result.query in (None, 0):
        return "cls"
    return centre_patch(result.layout)


def centre_patch(layout: TokenLayout) -> tuple[int, ...]:
    """The centre patch (row, col) of ``layout``'s grid; a video's (frame, row, col), in its
    middle token frame."""
    (gh, gw), frames = layout.grid, layout.frames
    return (*(() if frames is None else (frames // 2,)), gh // 2, gw // 2)


def query_label(query: str | tuple[int, ...]) -> str:
    """ "the class token" or "patch (row r, col c)", as the maps' hover names patches; a video's
    patch "patch (frame f, row r, col c)" (f: its token frame)."""
    if query == "cls":
        return "the class token"
    *frame, row, col = query
    return f"patch ({''.join(f'frame {f}, ' for f in frame)}row {row}, col {col})"


def outline_patch(fig: go.Figure, patch: tuple[int, int], grid: tuple[int, int],
                  size: tuple[int, int], **subplot) -> go.Figure:  # fmt: skip
    """Outline ``patch`` (row, col) of a ``grid`` (gh, gw) over an image of ``size`` (H, W)
    whose pixels are the axes (the query of an attention row); ``subplot``: its row and col."""
    (gh, gw), (height, width), (r, c) = grid, size, patch
    ph, pw = height / gh, width / gw
    fig.add_shape(
        type="rect", x0=c * pw - 0.5, x1=(c + 1) * pw - 0.5, y0=r * ph - 0.5,
        y1=(r + 1) * ph - 0.5, line={"color": "red", "width": 2}, **subplot,
    )  # fmt: skip
    return fig


def weight_range(weights: torch.Tensor) -> tuple[float, float]:
    """The colour range of attention weights: from 0 (no attention), as `attention_grid`'s, to
    their maximum."""
    return 0.0, max(weights.max().item(), 1e-12)


COLOUR_SCALES = ("robust", "shared", "per_panel")


def attention_grid(
    result: AttentionResult,
    image: int = 0,
    query: str | tuple[int, int] | None = None,
    scale: str = "robust",
    images: np.ndarray | None = None,
) -> go.Figure:
    """Layers x heads small multiples of one query's attention over the patch grid, the image
    beside them (the query patch outlined) when ``images`` are given.

    Args:
        result: from `vizkit.attention`.
        image: index in the batch.
        query: "cls", a patch (row, col) or a token index (default: `default_query`).
        scale: "robust" (default): one colour scale for all panels from 0 to the 99th
            percentile of the weights, so one large weight does not flatten every other panel
            (larger weights saturate); "shared": 0 to the maximum; "per_panel": each panel
            min-max scaled on its own (compare shapes, not strengths).
        images: display images (B, H, W, 3) uint8 (`display_images`), or None for the maps only.
    """
    _check_image(result, image)
    check_choice("scale", scale, COLOUR_SCALES)
    query = default_query(result) if query is None else query
    rows = result.row(query)[:, image].float().cpu()  # (L, H, gh, gw)
    depth, heads = rows.shape[:2]
    if scale == "per_panel":
        rows = torch.stack([torch.stack([min_max_scaled(m) for m in layer]) for layer in rows])
    top = rows.quantile(0.99).item() if scale == "robust" else rows.max().item()
    beside = 0 if images is None else 1  # the image's column
    specs = [[{"rowspan": depth}] * beside + [{}] * heads]
    specs += [[None] * beside + [{}] * heads for _ in range(depth - 1)]
    fig = make_subplots(
        rows=depth, cols=beside + heads, specs=specs,
        column_titles=["image"] * beside + [_head_title(h, heads) for h in range(heads)],
        row_titles=[f"layer {layer}" for layer in result.layers],
        horizontal_spacing=0.02, vertical_spacing=0.04 / max(1, depth / 4),
    )  # fmt: skip
    if images is not None:
        fig.add_trace(photo(images[image], hoverinfo="skip"), row=1, col=1)
        if isinstance(query, tuple):
            outline_patch(fig, query, result.layout.grid, images.shape[1:3], row=1, col=1)
        fig.update_yaxes(constraintoward="top", row=1, col=1)
    for i in range(depth):
        for h in range(heads):
            fig.add_trace(
                go.Heatmap(
                    z=rows[i, h].numpy(),
                    coloraxis="coloraxis",
                    hovertemplate="patch (row %{y}, col %{x}): %{z:.3f}<extra></extra>",
                ),
                row=i + 1,
                col=beside + h + 1,
            )
    map_axes(fig)
    bar = {
        "robust": "weight<br>(99th pct)",
        "shared": "weight",
        "per_panel": "min-max<br>per panel",
    }
    fig.update_layout(
        coloraxis={"colorscale": ATTENTION_SCALE, "cmin": 0, "cmax": max(top, 1e-12),
                   "colorbar": {"title": bar[scale]}},
    )  # fmt: skip
    how = {
        "robust": f"one colour scale, 0 to the 99th percentile {top:.3g}, max {rows.max():.3g}",
        "shared": "one colour scale",
        "per_panel": "each panel min-max scaled",
    }[scale]
    title = (
        f"Attention of {query_label(query)} over the patches, image {image}: layers x heads"
        f"<br><sup>post-softmax row; {how}{'; columns: heads' if heads > MANY_HEADS else ''}"
        "</sup>"
    )
    return finish(fig, title, height=max(300, 150 * depth + 110))


MANY_HEADS = 8  # more head columns than this are titled by their number alone


def _head_title(head: int, heads: int) -> str:
    """A column's title: "head 3", or "3" where there are too many columns for the word (24
    heads at 900 px would run their titles together)."""
    return f"head {head}" if heads <= MANY_HEADS else str(head)


def query_attention(
    result: AttentionResult,
    images: np.ndarray,
    image: int = 0,
    query: str | tuple[int, int] | None = None,
    layer: LayerSpec | None = None,
    heads: HeadSpec = "mean",
) -> go.Figure:
    """One query's attention row (heads fused) over the image, the query patch outlined.

    Args:
        images: display images (B, H, W, 3) uint8 (`display_images`).
        layer: a captured layer (`AttentionResult.position`: the model's layer index, negative
            from its last, or a hook name); default the last captured.
        heads: head reduction ("mean", "max", "min", a head, a list of heads to average).
    """
    _check_image(result, image)
    query = default_query(result) if query is None else query
    layer = result.position(layer)
    row = result.row(query, heads=heads)[layer, image]  # (gh, gw)
    fig = go.Figure(heatmap_on_image(images[image], row, colorscale=ATTENTION_SCALE,
                                     value="weight", zrange=weight_range(row)))  # fmt: skip
    if isinstance(query, tuple):
        outline_patch(fig, query, result.layout.grid, images.shape[1:3])
    map_axes(fig)
    opacity_slider(fig)
    title = (
        f"Attention of {query_label(query)} at layer {result.layers[layer]} ({heads} over "
        f"heads), image {image}"
    )
    return finish(fig, title, height=460)


def _check_image(result: AttentionResult, image: int) -> None:
    if isinstance(result, Stages):
        raise TypeError(
            f"This figure draws one token grid; the result holds {len(result)} stages of "
            "different grids. Pass one stage: result[-1] (the last), result[0], ..."
        )
    batch = result.patterns.shape[1]
    if not -batch <= image < batch:
        raise ValueError(f"image {image} is out of range: the result holds {batch} images.")


def attention_stats_figure(result: AttentionResult | Stages) -> go.Figure:
    """Per-layer attention statistics averaged over images and heads, with the spread over
    heads (min to max) as a band: normalized entropy, mean attention distance, locality (and
    for a video the mean distance in token frames; the others within the frame). A
    `Stages` result (a hierarchical model's default `attention`) gives every stage's layers in
    one curve, stages marked by dotted lines and their token grids named in the title."""
    stages = list(result) if isinstance(result, Stages) else [result]
    per_stage = [_drawn_stats(stage) for stage in stages]
    wanted = {k: label for k, label in DRAWN_STATS.items() if all(k in st for st in per_stage)}
    x = [str(layer) for stage in stages for layer in stage.layers]
    fig = make_subplots(rows=1, cols=len(wanted), horizontal_spacing=0.12)
    for col, (key, label) in enumerate(wanted.items(), start=1):
        per_head = [st[key].float().mean(1).cpu() for st in per_stage]  # (L_s, H_s) each
        mean = [v for p in per_head for v in p.mean(1).tolist()]
        high = [v for p in per_head for v in p.max(1).values.tolist()]
        low = [v for p in per_head for v in p.min(1).values.tolist()]
        fig.add_trace(
            go.Scatter(x=x + x[::-1], y=high + low[::-1], mode="lines",
                       fill="toself", line={"width": 0}, fillcolor="rgba(31,119,180,0.2)",
                       name="head range", showlegend=col == 1, hoverinfo="skip"),
            row=1, col=col,
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(x=x, y=mean, mode="lines+markers", name="mean",
                       line={"color": "#1f77b4"}, showlegend=col == 1),
            row=1, col=col,
        )  # fmt: skip
        fig.update_yaxes(title_text=label, row=1, col=col)
        start = 0
        for stage in stages[:-1]:  # a dotted line between stages
            start += len(stage.layers)
            fig.add_vline(x=start - 0.5, line={"dash": "dot", "color": "#888"}, row=1, col=col)
    fig.update_xaxes(title_text="layer", type="category")
    images = stages[0].patterns.shape[1]
    title = f"Attention statistics per layer ({images} images; band: min-max over heads)"
    if len(stages) > 1:
        grids = ", ".join(f"{s.layout.grid[0]}x{s.layout.grid[1]}" for s in stages)
        title += f"<br><sub>{len(stages)} stages (dotted lines), token grids {grids}</sub>"
    return finish(fig, title, 380 + 20 * (len(stages) > 1))


# the statistics `attention_stats_figure` draws (keys of `AttentionResult.stats`) and their axes
DRAWN_STATS = {
    "entropy": "entropy / log N (1 = uniform)",
    "distance_pixels": "mean distance (pixels)",
    "locality": "mass within 1 patch",
    "distance_frames": "mean distance (token frames)",  # videos only
}


def _drawn_stats(result: AttentionResult) -> dict[str, torch.Tensor]:
    """The `DRAWN_STATS` of ``result``, each (L, B, H), equal to `AttentionResult.stats`'s
    values but only these: the others (head diversity above all) are most of its time on
    large maps (Swin's first stage: 3136 x 3136 per head). One (image, layer) block at a time,
    as `stats`; distance and locality only with every query captured."""
    blocks = [[_drawn_block(result, p) for p in layer] for layer in result.patterns]
    return {
        key: torch.stack([torch.stack([s[key] for s in layer]) for layer in blocks])
        for key in blocks[0][0]
    }


def _drawn_block(result: AttentionResult, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """`_drawn_stats` of one image's maps in one layer, (H, Nq, N) -> (H,) each."""
    if result.maps == "applied":  # signed maps are measured as |A|, rows renormalized
        p = stats.absolute_rows(p)
    out = {"entropy": stats.query_entropy(p)}
    if result.query is None:
        out["distance_pixels"] = stats.mean_attention_distance(p, result.layout, result.patch_size)
        out["locality"] = stats.locality_mass(p, result.layout)
        if result.layout.frames is not None:
            out["distance_frames"] = stats.mean_frame_distance(p, result.layout)
    return out
