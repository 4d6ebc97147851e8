"""Shared look of vizkit figures: colour scales, layout defaults, images for display."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from torch import Tensor, nn

from ..datasets.normalize import denormalize

__all__ = [
    "ATTENTION_SCALE",
    "CKA_SCALE",
    "MIN_FONT_SIZE",
    "SALIENCY_SCALE",
    "display_images",
    "epoch_shades",
    "finish",
    "layer_label",
    "map_axes",
    "min_max_scaled",
    "palette",
    "step_slider",
]

SALIENCY_SCALE = "cividis"  # as the CaiT paper's Fig. 7
ATTENTION_SCALE = "viridis"
CKA_SCALE = "magma"
MASK_SCALE = "RdBu_r"
MIN_FONT_SIZE = 12  # px: `finish` raises smaller annotations (subplot titles) to it


def display_images(
    images: Tensor,
    model: nn.Module | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> np.ndarray:
    """Normalized images (B, C, H, W) as uint8 RGB (B, H, W, 3) for display; clips (B, T, C,
    H, W) as (B, T, H, W, 3).

    The normalization is undone with ``mean``/``std``, else with the model's timm data config;
    without either, each image is min-max scaled.
    """
    if isinstance(images, Tensor) and images.ndim == 5:  # clips: each frame an image
        frames = display_images(images.flatten(0, 1), model, mean, std)
        return frames.reshape(*images.shape[:2], *frames.shape[1:])
    if not isinstance(images, Tensor) or images.ndim != 4 or images.shape[1] not in (1, 3):
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a (B, 1 or 3, H, W) tensor; got {shape}.")
    x = images.detach().float().cpu()
    if mean is None and model is not None:
        cfg = getattr(model, "pretrained_cfg", None) or {}
        mean, std = cfg.get("mean"), cfg.get("std")
    if mean is not None and std is not None:
        if len(mean) != x.shape[1] or len(std) != x.shape[1]:
            raise ValueError(
                f"mean and std need one value per channel ({x.shape[1]}); got mean={mean}, "
                f"std={std}."
            )
        x = denormalize(x, mean, std)
    else:
        low = x.amin(dim=(1, 2, 3), keepdim=True)
        high = x.amax(dim=(1, 2, 3), keepdim=True)
        x = (x - low) / (high - low).clamp_min(1e-12)
    x = x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
    return (x.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).numpy()


def epoch_shades(count: int, scale: str = "Blues") -> list[str]:
    """``count`` colours from light to dark (later epochs darker, as the CaiT paper's Fig. 4)."""
    from plotly.colors import sample_colorscale

    positions = [0.35 + 0.65 * i / max(1, count - 1) for i in range(count)]
    return sample_colorscale(scale, positions)


def finish(fig: go.Figure, title: str, height: int | None = None) -> go.Figure:
    """Common layout: a title that names the quantity, compact margins, white template, no
    annotation (subplot titles) under `MIN_FONT_SIZE`."""
    notes = fig.layout.annotations or ()
    for note in notes:
        if note.font.size is not None and note.font.size < MIN_FONT_SIZE:
            note.font.size = MIN_FONT_SIZE
    top = 95 if "<br>" in title else 70
    if any("<br>" in (a.text or "") for a in notes):  # two-line subplot titles sit between
        top += 55 if "<br>" in title else 25  # the title (centred in the margin) and the plots
    right = 20
    if any(a.textangle == 90 for a in notes):  # row titles right of the plots: the colour
        right = 110  # bars move out of their way
        for axis in (k for k in fig.layout if k.startswith("coloraxis")):
            fig.layout[axis].colorbar.x = 1.07
        fig.update_traces(colorbar_x=1.07, selector={"type": "heatmap"})
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        margin={"l": 50, "r": right, "t": top, "b": 40},
        **({"height": height} if height else {}),
    )
    return fig


def square_cells(fig: go.Figure) -> go.Figure:
    """Square cells in every subplot holding a map (heatmap or image): each such y axis is
    scaled to the x axis of its own subplot (``update_yaxes(scaleanchor="x")`` would tie every
    panel to the first one's x axis)."""
    for trace in fig.data:
        if not isinstance(trace, go.Heatmap | go.Image):
            continue
        x, y = trace.xaxis or "x", trace.yaxis or "y"
        fig.layout["yaxis" + y[1:]].update(scaleanchor=x, constrain="domain")
        fig.layout["xaxis" + x[1:]].update(constrain="domain")
    return fig


def layer_label(name: str) -> str:
    """A hook name as a figure labels its layer: ``blocks.3.hook_resid_post`` -> ``blocks.3``
    (a second model's ``model_b:`` prefix dropped)."""
    return name.removeprefix("model_b:").rsplit(".hook_", 1)[0]


def map_axes(fig: go.Figure) -> go.Figure:
    """Axes of maps and images: row 0 at the top, no tick labels (the hover names the cell),
    square cells in every subplot."""
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    return square_cells(fig)


def log_axis(
    fig: go.Figure, axis: str, values: np.ndarray | None = None, **where_and_titles
) -> go.Figure:
    """A log ``axis`` ("x" or "y") ticked at 1, 2, 5 x 10^k over the data's range (1, 2, 3, 5
    over less than two decades; every digit where that gives fewer than three ticks), each tick
    written in full ("0.02", "50"), not plotly's abbreviated minor digits. The range is that of
    ``values``, or of every trace's data; ``where_and_titles`` (``row=``, ``col=``, titles) go to
    the axis update (default: every subplot)."""
    if values is None:
        values = np.concatenate([
            np.asarray(getattr(t, axis), dtype=float).ravel()
            for t in fig.data if getattr(t, axis) is not None
        ])  # fmt: skip
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    if not len(values):
        return update(type="log", **where_and_titles)
    low, high = values.min(), values.max()
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    steps = (1, 2, 5) if high / low >= 100 else (1, 2, 3, 5)
    for mantissas in (steps, range(1, 10)):
        ticks = [m * 10.0**e for e in decades for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) >= 3:
            break
    return update(
        type="log", tickvals=ticks, ticktext=[f"{v:g}" for v in ticks], **where_and_titles
    )


def min_max_scaled(values: Tensor) -> Tensor:
    """A map scaled to [0, 1] (float32, on the CPU); a constant map becomes 0."""
    values = values.detach().float().cpu()
    low, high = values.min(), values.max()
    return (values - low) / (high - low).clamp_min(1e-12)


def palette(i: int) -> str:
    """The ``i``-th colour of plotly's qualitative palette (one per model in a comparison)."""
    return qualitative.Plotly[i % len(qualitative.Plotly)]


def method_color(name: str) -> str:
    """The colour of saliency method ``name``, the same in every figure: its place in the
    registry (`vizkit.methods.METHODS`) in a 24-colour palette; a method of the user's own by
    its name's characters (stable across runs, unlike ``hash``)."""
    from ..methods.registry import METHODS

    known = list(METHODS)
    index = known.index(name) if name in known else sum(map(ord, name))
    return qualitative.Dark24[index % len(qualitative.Dark24)]


def step_slider(fig: go.Figure, labels: Sequence[str], per_step: int, active: int, prefix: str):
    """A slider that shows one group of ``per_step`` consecutive traces at a time (the traces
    were added group by group, one group per label); ``active`` is the group shown first."""
    steps = [
        {"label": label, "method": "update",
         "args": [{"visible": [t // per_step == i for t in range(len(fig.data))]}]}
        for i, label in enumerate(labels)
    ]  # fmt: skip
    for t, trace in enumerate(fig.data):
        trace.visible = t // per_step == active
    fig.update_layout(sliders=[{"active": active, "steps": steps, "pad": {"t": 55},
                                "currentvalue": {"prefix": prefix}}])  # fmt: skip
    return fig  # pad: the slider's label sits below the x-axis title, not on it
