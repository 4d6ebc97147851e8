"""Heatmaps laid over images, with an opacity slider."""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Sequence

import numpy as np
import PIL.Image
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from .style import SALIENCY_SCALE, map_axes, min_max_scaled

__all__ = [
    "OPACITY", "heatmap_on_image", "opacity_slider", "map_placement", "overlay_grid", "photo",
]  # fmt: skip

OPACITY = 0.6  # of a map over its image; a step of the opacity slider, which starts there


def photo(image: np.ndarray, **trace) -> go.Image:
    """An (H, W, 3) uint8 image as a plotly Image trace that carries it as a PNG (``source``),
    pixels as the axes as with ``z``: a FigureWidget sends a ``z`` array as nested lists (0.15
    s per 224 px image; eight per view in the feature browser), a PNG as one string."""
    pixels = np.ascontiguousarray(image, dtype=np.uint8)
    return go.Image(source=_png_source(pixels.tobytes(), pixels.shape), **trace)


@functools.lru_cache(maxsize=64)  # an explorer redraws the same photos after each change
def _png_source(pixels: bytes, shape: tuple[int, ...]) -> str:
    """The data URI of the PNG of (H, W, 3) uint8 ``pixels``."""
    buffer = io.BytesIO()
    PIL.Image.fromarray(np.frombuffer(pixels, np.uint8).reshape(shape)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def map_placement(values: np.ndarray, height: int, width: int) -> tuple[dict, str]:
    """Where a (h, w) map lies over an (height, width) image whose pixels are the axes, and
    what its hover names: a pixel map as it is; a coarser map (patches, feature-map cells)
    drawn at its own resolution, each cell spanning its pixels and hovering as
    "patch (row r, col c)"."""
    rows, cols = values.shape
    if (rows, cols) == (height, width):
        return {}, "pixel (x %{x}, y %{y})"
    dy, dx = height / rows, width / cols
    index = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"), axis=-1)
    place = {"x0": (dx - 1) / 2, "dx": dx, "y0": (dy - 1) / 2, "dy": dy, "customdata": index}
    return place, "patch (row %{customdata[0]}, col %{customdata[1]})"


def heatmap_on_image(
    image: np.ndarray,
    values: Tensor,
    *,
    opacity: float = OPACITY,
    colorscale: str = SALIENCY_SCALE,
    name: str = "",
    colorbar: bool = True,
    coloraxis: str | None = None,
    zrange: tuple[float, float] | None = None,
    value: str = "",
) -> list[go.BaseTraceType]:
    """Traces of one image (H, W, 3 uint8) with a map (h, w) over it, pixels as the axes; the
    map keeps its own resolution (one cell per patch) and hovers in its own coordinates.
    ``value`` names what the map holds (the colour bar's title)."""
    height, width = image.shape[:2]
    z = values.detach().float().cpu().numpy()
    place, where = map_placement(z, height, width)
    heat = {
        "z": z,
        "opacity": opacity,
        "name": name,
        "hovertemplate": where + ": %{z:.3g}<extra>" + name + "</extra>",
        **place,
    }
    if coloraxis:
        heat["coloraxis"] = coloraxis
    else:
        heat.update(colorscale=colorscale, showscale=colorbar, colorbar={"title": value})
        if zrange is not None:
            heat.update(zmin=zrange[0], zmax=zrange[1])
    return [photo(image, hoverinfo="skip"), go.Heatmap(**heat)]


def opacity_slider(fig: go.Figure, active: float = OPACITY) -> go.Figure:
    """Add a slider that sets the opacity of every heatmap of ``fig`` (works in static HTML)."""
    heatmaps = [i for i, t in enumerate(fig.data) if isinstance(t, go.Heatmap)]
    steps = [
        {
            "label": f"{o:.1f}",
            "method": "restyle",
            "args": [{"opacity": [o] * len(heatmaps)}, heatmaps],
        }
        for o in (i / 10 for i in range(11))
    ]
    active_step = round(active * 10)
    fig.update_layout(
        sliders=[
            {
                "active": active_step,
                "currentvalue": {"prefix": "map opacity "},
                "steps": steps,
                "pad": {"t": 30},
                "len": 0.5,
            }  # fmt: skip
        ]
    )
    return fig


def overlay_grid(
    cells: Sequence[Sequence[tuple[np.ndarray, Tensor | None]]], scaled: bool = True, **subplots
):
    """A grid of (image, map) cells: each map min-max scaled over its image (``scaled=False``:
    as given, already in [0, 1], e.g. scaled over a clip) on one shared saliency colour axis
    (0..1); a None map shows the image alone. ``subplots`` go to plotly's ``make_subplots``
    (titles, spacing)."""
    fig = make_subplots(rows=len(cells), cols=len(cells[0]), **subplots)
    for r, row in enumerate(cells, start=1):
        for c, (image, values) in enumerate(row, start=1):
            if values is None:
                traces = [photo(image, hoverinfo="skip")]
            else:
                shown = min_max_scaled(values) if scaled else values
                traces = heatmap_on_image(image, shown, coloraxis="coloraxis")
            for trace in traces:
                fig.add_trace(trace, row=r, col=c)
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1})
    return fig
