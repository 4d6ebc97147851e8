"""Token figures: PCA colour maps of patch tokens, token norms with their high-norm outliers, and
what a test-time register changes (attention and norms without and with it)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ..analysis import TokenNorms, TokenPCA
from ..hooks.selector import LayerSpec, select_layer
from ..registers import RegisterEffect
from .overlay import heatmap_on_image, photo
from .style import ATTENTION_SCALE, finish, layer_label, log_axis, map_axes, square_cells

__all__ = ["register_effect_figure", "token_norms_figure", "token_pca_figure"]

_BINS = 40  # of the norms' histogram
HISTOGRAM_GAP = 0.05  # of the figure's width, between the maps and the histogram's axis title


def token_pca_figure(
    result: TokenPCA,
    images: np.ndarray | None = None,
    count: int = 4,
    components: tuple[int, int, int] = (0, 1, 2),
) -> go.Figure:
    """Three principal components of the patch tokens as red, green and blue (`TokenPCA.rgb`,
    scaled over the whole batch), one panel per image, under the images (B, H, W, 3) uint8
    when given. Clips (``result.layout.frames``): one row per clip, its token frames side by
    side, each under the first frame of its tubelet when the clips' frames (B, T, H, W, 3)
    are given."""
    rgb = (result.rgb(components) * 255).round().byte().numpy()  # (B, [T',] gh, gw, 3)
    frames = result.layout.frames
    if frames is None:
        fig, rows = _image_pca(result, rgb, images, count)
        what = f"{len(rgb)} images"
    else:
        fig, rows = _clip_pca(result, rgb, images, count)
        what = f"{len(rgb)} clips of {frames} token frames"
    map_axes(fig)
    shares = ", ".join(
        f"{c + 1}: {result.explained_variance_ratio[c]:.0%}" for c in components
    )  # fmt: skip
    title = (
        f"PCA of the patch tokens of {layer_label(result.layer)} over {what} "
        f"({result.fitted} tokens fitted)<br>components as red, green, blue; variance {shares}"
    )
    return finish(fig, title, 260 * rows + 110)


def _image_pca(
    result: TokenPCA, rgb: np.ndarray, images: np.ndarray | None, count: int
) -> tuple[go.Figure, int]:
    """The panels of images' colours (B, gh, gw, 3): one column per image, under it when
    ``images`` are given; the figure and its rows."""
    shown = _shown(count, len(rgb), images, result.image_size)
    rows = 1 if images is None else 2
    fig = make_subplots(rows=rows, cols=len(shown), vertical_spacing=0.04,
                        horizontal_spacing=0.02,
                        subplot_titles=[f"image {i}" for i in shown])  # fmt: skip
    for col, i in enumerate(shown, start=1):
        if images is not None:
            fig.add_trace(photo(images[i], hoverinfo="skip"), row=1, col=col)
        fig.add_trace(_colours(rgb[i], result, ""), row=rows, col=col)
    return fig, rows


def _clip_pca(
    result: TokenPCA, rgb: np.ndarray, images: np.ndarray | None, count: int
) -> tuple[go.Figure, int]:
    """The panels of clips' colours (B, T', gh, gw, 3): a row per clip, a column per token
    frame (over a row of the clip's frames when ``images`` are given); the figure and its
    rows."""
    frames = result.layout.frames
    shown = _shown(count, len(rgb), images, result.image_size, frames)
    labels = _frame_labels(frames, images)
    per_clip = 1 if images is None else 2
    titles = []
    for i in shown:
        titles += [f"clip {i}, {label}" for label in labels] + [""] * frames * (per_clip - 1)
    rows = len(shown) * per_clip
    fig = make_subplots(rows=rows, cols=frames, subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.12 / rows)  # fmt: skip
    for n, i in enumerate(shown):
        for t in range(frames):
            if images is not None:
                first = t * (images.shape[1] // frames)  # the first frame of its tubelet
                fig.add_trace(photo(images[i, first], hoverinfo="skip"), row=n * per_clip + 1,
                              col=t + 1)  # fmt: skip
            fig.add_trace(_colours(rgb[i, t], result, f"frame {t}, "), row=(n + 1) * per_clip,
                          col=t + 1)  # fmt: skip
    return fig, rows


def _colours(rgb: np.ndarray, result: TokenPCA, where: str) -> go.Image:
    """One token grid's colours (gh, gw, 3) over the input's pixels (its cells the patches)."""
    height, width = result.image_size
    gh, gw = result.layout.grid
    hover = where + "patch %{y}, %{x}<extra></extra>"
    return go.Image(z=rgb, x0=(width / gw - 1) / 2, dx=width / gw, y0=(height / gh - 1) / 2,
                    dy=height / gh, hovertemplate=hover)  # fmt: skip


def token_norms_figure(
    result: TokenNorms, images: np.ndarray | None = None, layer: LayerSpec = -1, count: int = 4
) -> go.Figure:
    """One layer's patch-token norms on the first ``count`` images (one colour scale, in the
    stream's units), beside the histogram of every token norm of that layer (patches and
    prefix tokens): high-norm outliers (Darcet et al. 2024) form a second mode far right.
    Clips (``result.layout.frames``): one row per clip, its token frames side by side, each over
    the first frame of its tubelet when the clips' frames (B, T, H, W, 3) are given."""
    name = select_layer(layer, result.layers, what="layers of the result")
    index = result.layers.index(name)
    norms = result.patches[:, index]  # (B, gh, gw), for clips (B, T', gh, gw)
    frames = result.layout.frames
    if frames is None:
        fig, rows, hist = _image_norms(norms, images, count, result.image_size)
        what, unit = f"{len(norms)} images", "image"
    else:
        fig, rows, hist = _clip_norms(norms, images, count, result.image_size)
        what, unit = f"{len(norms)} clips of {frames} token frames", "clip"
    _norm_histogram(fig, norms, result.prefix[:, index].flatten(), hist)
    fig.update_layout(
        coloraxis={"colorscale": ATTENTION_SCALE, "colorbar": {"title": "norm", "x": -0.08}},
        barmode="overlay",
    )
    flagged = result.high_norm()[:, index].float().mean().item()
    title = (
        f"L2 norm of every token of {layer_label(name)} ({what});<br>"
        f"{flagged:.1%} of patch tokens above 4x their {unit}'s median"
    )
    return finish(fig, title, 360 if rows == 1 else 230 * rows + 130)


def _image_norms(
    norms: Tensor, images: np.ndarray | None, count: int, size: tuple[int, int]
) -> tuple[go.Figure, int, int]:
    """Images' norm maps (B, gh, gw) in a row, the histogram's column last; the figure, its
    rows and the histogram's column."""
    shown = _shown(count, len(norms), images, size)
    fig = make_subplots(rows=1, cols=len(shown) + 1, column_widths=[1] * len(shown) + [2],
                        horizontal_spacing=0.05,
                        subplot_titles=[f"image {i}" for i in shown] + ["all tokens"])  # fmt: skip
    for col, i in enumerate(shown, start=1):
        image = None if images is None else images[i]
        _norm_panel(fig, norms[i], image, "", row=1, col=col)
    return fig, 1, len(shown) + 1


def _clip_norms(
    norms: Tensor, images: np.ndarray | None, count: int, size: tuple[int, int]
) -> tuple[go.Figure, int, int]:
    """Clips' norm maps (B, T', gh, gw): a row per clip, a column per token frame, the
    histogram's column last (over every row); the figure, its rows and the histogram's
    column."""
    frames = norms.shape[1]
    shown = _shown(count, len(norms), images, size, frames)
    labels = _frame_labels(frames, images)
    rows = len(shown)
    specs = [[{}] * frames + [{"rowspan": rows}]] + [[{}] * frames + [None] for _ in shown[1:]]
    titles = [f"clip {shown[0]}, {label}" for label in labels] + ["all tokens"]
    titles += [f"clip {i}, {label}" for i in shown[1:] for label in labels]
    fig = make_subplots(rows=rows, cols=frames + 1, specs=specs, subplot_titles=titles,
                        column_widths=[1] * frames + [2], horizontal_spacing=0.03,
                        vertical_spacing=0.12 / rows)  # fmt: skip
    for n, i in enumerate(shown):
        for t in range(frames):
            image = None if images is None else images[i, t * (images.shape[1] // frames)]
            _norm_panel(fig, norms[i, t], image, f"frame {t}, ", row=n + 1, col=t + 1)
    return fig, rows, frames + 1


def _norm_panel(
    fig: go.Figure, norms: Tensor, image: np.ndarray | None, where: str, **cell: int
) -> None:
    """One token grid's norms (gh, gw) at ``cell`` (row, col), over ``image`` (H, W, 3) when
    given; ``where`` starts the hover text (a clip's frame)."""
    if image is not None:
        traces = heatmap_on_image(image, norms, coloraxis="coloraxis", name="norm")
    else:
        hover = where + "patch %{y}, %{x}: %{z:.3g}<extra></extra>"
        traces = [go.Heatmap(z=norms.numpy(), coloraxis="coloraxis", hovertemplate=hover)]
    for trace in traces:
        fig.add_trace(trace, **cell)
    fig.update_xaxes(showticklabels=False, **cell)
    fig.update_yaxes(showticklabels=False, autorange="reversed", **cell)


def _norm_histogram(fig: go.Figure, norms: Tensor, prefix: Tensor, col: int) -> None:
    """The histogram of every patch norm ``norms`` and prefix norm (n,) in row 1, column
    ``col`` (log counts), with the maps' cells made square; its title keys the bars' colours
    (a legend would sit on the bars), its plot moved right of its axis title."""
    edges = torch.linspace(0, max(norms.max().item(), prefix.max().item() if len(prefix) else 0)
                           * 1.02, _BINS + 1)  # fmt: skip
    counts, keys = [], []
    for label, values, color in (("patch tokens", norms.flatten(), "#636EFA"),
                                 ("prefix tokens", prefix, "#EF553B")):  # fmt: skip
        if not len(values):
            continue
        tally = torch.histogram(values, edges).hist
        counts.append(tally)
        keys.append(f'<span style="color:{color}">{label.split()[0]}</span>')
        bars = go.Bar(
            x=((edges[1:] + edges[:-1]) / 2).numpy(),
            y=tally.numpy(),
            width=(edges[1] - edges[0]).item(),
            name=label,
            marker_color=color,
            opacity=0.75,
            showlegend=False,
            hovertemplate=f"%{{y}} {label} of norm %{{x:.3g}}<extra></extra>",
        )
        fig.add_trace(bars, row=1, col=col)
    fig.for_each_annotation(
        lambda a: a.update(text=f"all tokens: {' and '.join(keys)}"),
        selector={"text": "all tokens"},
    )
    axis = fig.get_subplot(1, col).xaxis
    axis.domain = (axis.domain[0] + HISTOGRAM_GAP, axis.domain[1])
    square_cells(fig)
    fig.update_xaxes(title_text="token norm", row=1, col=col)
    log_axis(fig, "y", torch.cat(counts).numpy(), row=1, col=col, title_text="tokens")


def _frame_labels(frames: int, images: np.ndarray | None) -> list[str]:
    """A title for each of a clip's ``frames`` token frames: the input frames it spans where
    the clips' frames (B, T, H, W, 3) are given ("frame 3", "frames 6-7"), else "token frame
    t"."""
    if images is None:
        return [f"token frame {t}" for t in range(frames)]
    span = images.shape[1] // frames
    if span == 1:
        return [f"frame {t}" for t in range(frames)]
    return [f"frames {t * span}-{(t + 1) * span - 1}" for t in range(frames)]


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


def _shown(
    count: int, batch: int, images: np.ndarray | None, size: tuple[int, int],
    frames: int | None = None,
) -> range:  # fmt: skip
    """The images (clips, where the result has ``frames`` token frames) a figure shows: the
    first ``count`` of the batch; ``images`` must be the batch as (B, H, W, 3) at the analysed
    size, or the clips' frames (B, T, H, W, 3), T a multiple of ``frames``."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int; got {count!r}.")
    if images is None:
        return range(min(count, batch))
    if frames is None and tuple(images.shape) != (batch, *size, 3):
        raise ValueError(
            f"images must be the analysed batch as (B, H, W, 3) uint8, {(batch, *size, 3)} "
            f"(e.g. vk.viz.display_images(x, model)); got {tuple(images.shape)}."
        )
    if frames is not None and not _clips_frames(images, batch, size, frames):
        raise ValueError(
            f"images must be the analysed clips' frames as (B, T, H, W, 3) uint8, B = {batch}, "
            f"(H, W) = {size} and T a multiple of the {frames} token frames (e.g. "
            f"vk.viz.display_images(x, model) of the clips x); got {tuple(images.shape)}."
        )
    return range(min(count, batch))


def _clips_frames(images: np.ndarray, batch: int, size: tuple[int, int], frames: int) -> bool:
    """Whether ``images`` are ``batch`` clips' frames (B, T, H, W, 3) of ``size``, T a multiple
    of the ``frames`` token frames."""
    shape = tuple(images.shape)
    return (len(shape) == 5 and shape[0] == batch and shape[2:] == (*size, 3)
            and shape[1] % frames == 0)  # fmt: skip
