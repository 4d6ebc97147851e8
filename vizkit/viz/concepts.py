"""Figures of `vizkit.concepts` results: maps conditioned on units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .overlay import heatmap_on_image
from .style import MASK_SCALE, finish

__all__ = ["conditioned_maps_figure"]


def conditioned_maps_figure(
    result: object, images: np.ndarray, names: Mapping[int, str] | None = None,
    rows: Sequence[int] | None = None, scale: str = "shared",
) -> go.Figure:  # fmt: skip
    """A row per image: its unconditioned map, the map through each chosen unit and through the
    rest (`vk.concepts.ConditionedMaps`, (B, L, H, W)), over the image (B, H, W, 3 uint8), on
    signed colour axes (red: for the target, blue: against). ``names``: unit index -> its
    name (`vk.concepts.unit_names`) for the column titles; ``rows``: the images shown (default
    the first four); ``scale``: "shared", one colour axis for every panel (a unit's share
    beside the whole), or "each", a colour axis per column, its range (+-) under the column
    (where a unit is a small share of the whole, its own pattern)."""
    if scale not in ("shared", "each"):
        raise ValueError(f"scale must be 'shared' or 'each'; got {scale!r}.")
    count = len(result.total)
    if len(images) != count:
        raise ValueError(f"{len(images)} display images for a result of {count} images.")
    rows = list(range(min(4, count))) if rows is None else list(rows)
    chosen = result.options.get("chosen", list(range(len(result.units))))
    names = names or {}
    short = [label.replace(f"{result.layer} ", "channel ") for label in result.units]
    titles = ["all units"] + [
        f"{names[unit].split(' (')[0]}<br>{label}" if unit in names else label
        for unit, label in zip(chosen, short, strict=True)
    ] + ["the rest"]  # fmt: skip
    columns = len(titles)
    panels = [result.total[rows], *result.maps[rows].unbind(1), result.rest[rows]]
    ranges = [max(float(p.abs().max()), 1e-12) for p in panels]
    fig = make_subplots(rows=len(rows), cols=columns, horizontal_spacing=0.01,
                        vertical_spacing=0.03, column_titles=titles)  # fmt: skip
    axes = [f"coloraxis{c + 1 if c else ''}" if scale == "each" else "coloraxis"
            for c in range(columns)]  # fmt: skip
    for r, image in enumerate(rows):
        for c, panel in enumerate(panels):
            for trace in heatmap_on_image(images[image], panel[r], coloraxis=axes[c],
                                          name=titles[c].split("<br>")[0]):  # fmt: skip
                fig.add_trace(trace, row=r + 1, col=c + 1)
        fig.update_yaxes(title_text=f"image {image}", row=r + 1, col=1)
    fig.update_xaxes(showticklabels=False, showgrid=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, autorange="reversed")
    for n in range(len(rows) * columns):
        fig.layout[f"yaxis{n + 1 if n else ''}"].scaleanchor = f"x{n + 1 if n else ''}"
    if scale == "shared":
        largest = max(ranges)
        fig.update_layout(coloraxis={"colorscale": MASK_SCALE, "cmin": -largest, "cmax": largest,
                                     "colorbar": {"title": {"text": "relevance"}}})  # fmt: skip
    else:  # each column its own axis, its range under it; the colour bar shows the shape only
        for c, top in enumerate(ranges):
            fig.update_xaxes(title_text=f"±{top:.2g}", row=len(rows), col=c + 1)
            fig.update_layout({axes[c]: {
                "colorscale": MASK_SCALE, "cmin": -top, "cmax": top, "showscale": c == 0,
                "colorbar": {"title": {"text": "relevance<br>(± under<br>each column)"},
                             "tickvals": [-top, 0, top], "ticktext": ["−", "0", "+"]},
            }})  # fmt: skip
    method = result.options.get("method", "")
    title = f"{method} relevance through units of {result.layer}"
    return finish(fig, title, 130 + 150 * len(rows))
