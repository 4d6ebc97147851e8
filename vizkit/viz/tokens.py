"""Token figures: PCA colour maps of patch tokens, token norms with their high-norm outliers, and
what a test-time register changes (attention and norms without and with it)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..analysis import TokenNorms, TokenPCA
from ..hooks.selector import LayerSpec, select_layer
from ..registers import RegisterEffect
from .overlay import heatmap_on_image, photo
from .style import ATTENTION_SCALE, finish, layer_label, log_axis, map_axes, square_cells

__all__ = ["register_effect_figure", "token_norms_figure", "token_pca_figure"]

_BINS = 40  # of the norms' histogram


def token_pca_figure(
    result: TokenPCA,
    images: np.ndarray | None = None,
    count: int = 4,
    components: tuple[int, int, int] = (0, 1, 2),
) -> go.Figure:
    """Three principal components of the patch tokens as red, green and blue (`TokenPCA.rgb`,
    scaled over the whole batch), one panel per image, under the images (B, H, W, 3) uint8
    when given."""
    rgb = (result.rgb(components) * 255).round().byte().numpy()  # (B, gh, gw, 3)
    shown = _shown(count, len(rgb), images, result.image_size)
    height, width = result.image_size
    rows = 1 if images is None else 2
    titles = [f"image {i}" for i in shown]
    fig = make_subplots(rows=rows, cols=len(shown), vertical_spacing=0.04,
                        horizontal_spacing=0.02, subplot_titles=titles)  # fmt: skip
    gh, gw = result.layout.grid
    for col, i in enumerate(shown, start=1):
        if images is not None:
            fig.add_trace(photo(images[i], hoverinfo="skip"), row=1, col=col)
        fig.add_trace(
            go.Image(z=rgb[i], x0=(width / gw - 1) / 2, dx=width / gw, y0=(height / gh - 1) / 2,
                     dy=height / gh, hovertemplate="patch %{y}, %{x}<extra></extra>"),
            row=rows, col=col,
        )  # fmt: skip
    map_axes(fig)
    shares = ", ".join(
        f"{c + 1}: {result.explained_variance_ratio[c]:.0%}" for c in components
    )  # fmt: skip
    title = (
        f"PCA of the patch tokens of {layer_label(result.layer)} over {len(rgb)} images "
        f"({result.fitted} tokens fitted)<br>components as red, green, blue; variance {shares}"
    )
    return finish(fig, title, 260 * rows + 110)


def token_norms_figure(
    result: TokenNorms, images: np.ndarray | None = None, layer: LayerSpec = -1, count: int = 4
) -> go.Figure:
    """One layer's patch-token norms on the first ``count`` images (one colour scale, in the
    stream's units), beside the histogram of every token norm of that layer (patches and
    prefix tokens): high-norm outliers (Darcet et al. 2024) form a second mode far right."""
    name = select_layer(layer, result.layers, what="layers of the result")
    index = result.layers.index(name)
    norms = result.patches[:, index]  # (B, gh, gw)
    shown = _shown(count, len(norms), images, result.image_size)
    fig = make_subplots(rows=1, cols=len(shown) + 1, column_widths=[1] * len(shown) + [2],
                        horizontal_spacing=0.05,
                        subplot_titles=[f"image {i}" for i in shown] + ["all tokens"])  # fmt: skip
    for col, i in enumerate(shown, start=1):
        if images is not None:
            traces = heatmap_on_image(images[i], norms[i], coloraxis="coloraxis", name="norm")
        else:
            hover = "patch %{y}, %{x}: %{z:.3g}<extra></extra>"
            traces = [go.Heatmap(z=norms[i].numpy(), coloraxis="coloraxis", hovertemplate=hover)]
        for trace in traces:
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(showticklabels=False, row=1, col=col)
        fig.update_yaxes(showticklabels=False, autorange="reversed", row=1, col=col)
    hist = len(shown) + 1
    prefix = result.prefix[:, index].flatten()
    edges = torch.linspace(0, max(norms.max().item(), prefix.max().item() if len(prefix) else 0)
                           * 1.02, _BINS + 1)  # fmt: skip
    counts = []
    for label, values, color in (("patch tokens", norms.flatten(), "#636EFA"),
                                 ("prefix tokens", prefix, "#EF553B")):  # fmt: skip
        if not len(values):
            continue
        tally = torch.histogram(values, edges).hist
        counts.append(tally)
        bars = go.Bar(
            x=((edges[1:] + edges[:-1]) / 2).numpy(),
            y=tally.numpy(),
            width=(edges[1] - edges[0]).item(),
            name=label,
            marker_color=color,
            opacity=0.75,
            hovertemplate="norm %{x:.3g}: %{y} tokens<extra></extra>",
        )
        fig.add_trace(bars, row=1, col=hist)
    square_cells(fig)
    fig.update_xaxes(title_text="token norm", row=1, col=hist)
    log_axis(fig, "y", torch.cat(counts).numpy(), row=1, col=hist, title_text="tokens")
    fig.update_layout(
        coloraxis={"colorscale": ATTENTION_SCALE, "colorbar": {"title": "norm", "x": -0.08}},
        barmode="overlay",
        legend={"x": 1, "xanchor": "right", "y": 1},
    )
    flagged = result.high_norm()[:, index].float().mean().item()
    title = (
        f"L2 norm of every token of {layer_label(name)} ({len(norms)} images); "
        f"{flagged:.1%} of patch tokens above 4x their image's median"
    )
    return finish(fig, title, 360)


def register_effect_figure(
    result: RegisterEffect, images: np.ndarray | None = None, count: int = 2
) -> go.Figure:
    """The class token's attention and the patch norms of the first ``count`` images without
    (top row) and with (bottom row) the test-time register, each quantity on one colour scale
    for both rows, over the images (B, H, W, 3) uint8 when given."""
    shown = _shown(count, result.attention.shape[1], images, result.image_size)
    kinds = (("attention", result.attention, "coloraxis"), ("norm", result.norms, "coloraxis2"))
    titles = [f"{kind}<br>image {i}" for i in shown for kind, _, _ in kinds]
    fig = make_subplots(rows=2, cols=2 * len(shown), subplot_titles=titles + [""] * len(titles),
                        row_titles=["without", "with register"], horizontal_spacing=0.03,
                        vertical_spacing=0.06)  # fmt: skip
    for row in (0, 1):
        for n, i in enumerate(shown):
            for k, (kind, values, axis) in enumerate(kinds):
                col = 2 * n + k + 1
                if images is not None:
                    traces = heatmap_on_image(images[i], values[row, i], coloraxis=axis, name=kind)
                else:
                    hover = "patch %{y}, %{x}: %{z:.3g}<extra>" + kind + "</extra>"
                    traces = [go.Heatmap(z=values[row, i].numpy(), coloraxis=axis,
                                         hovertemplate=hover)]  # fmt: skip
                for trace in traces:
                    fig.add_trace(trace, row=row + 1, col=col)
    map_axes(fig)
    fig.update_layout(
        coloraxis={"colorscale": ATTENTION_SCALE, "colorbar": {"title": "attention", "x": 1.0,
                   "len": 0.45, "y": 0.78}},
        coloraxis2={"colorscale": "magma", "colorbar": {"title": "norm", "x": 1.0, "len": 0.45,
                    "y": 0.22}},
    )  # fmt: skip
    finish(fig, _register_title(result), 2 * 210 + 170)
    return fig.update_layout(margin_t=145)  # two title lines above two-line subplot titles


def _register_title(result: RegisterEffect) -> str:
    """What moved, and what it cost: the neurons, the register's norm, the output kept."""
    neurons, blocks = sum(len(v) for v in result.neurons.values()), len(result.neurons)
    registers = result.register_norms.shape[1]
    line = (
        f"Test-time register: {_count(neurons, 'neuron')} in {_count(blocks, 'block')} moved to "
        f"{_count(registers, 'extra token')}; attention of {result.attention_block}, norms at "
        f"{result.detect}"
    )
    kept = f"output cosine {result.output_cosine.mean():.3f}"
    if result.agreement is not None:
        kept += f", prediction kept on {result.agreement.float().mean():.0%}"
    if result.deletion is not None:
        deleted, inserted = result.deletion.mean(1).tolist(), result.insertion.mean(1).tolist()
        kept += (f"; deletion AUC {deleted[0]:.3f} -> {deleted[1]:.3f}, insertion "
                 f"{inserted[0]:.3f} -> {inserted[1]:.3f}")  # fmt: skip
    return f"{line}<br>{kept}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _shown(count: int, batch: int, images: np.ndarray | None, size: tuple[int, int]) -> range:
    """The images a figure shows: the first ``count`` of the batch; ``images`` must be the batch
    as (B, H, W, 3) at the analysed size."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int; got {count!r}.")
    expected = (batch, *size, 3)
    if images is not None and tuple(images.shape) != expected:
        raise ValueError(
            f"images must be the analysed batch as (B, H, W, 3) uint8, {expected} (e.g. "
            f"vk.viz.display_images(x, model)); got {tuple(images.shape)}."
        )
    return range(min(count, batch))
