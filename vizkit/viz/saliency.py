"""Saliency maps over the image: one method, or several side by side with their scores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from torch import Tensor

from ..analysis import SaliencyResult
from ..metrics.registry import METRICS
from ..metrics.table import SaliencyTable
from .overlay import heatmap_on_image, opacity_slider, overlay_grid
from .regions import Region, outline_regions, region_label
from .style import MIN_FONT_SIZE, finish, map_axes, min_max_scaled

__all__ = ["check_display", "saliency_overlay", "saliency_row", "saliency_side_by_side"]


def saliency_overlay(
    result: SaliencyResult,
    images: np.ndarray,
    image: int = 0,
    classes: Sequence[str] | None = None,
    region: Region | None = None,
) -> go.Figure:
    """One method's map of one image over it (cividis, min-max per map); the title names the
    class explained (by name with ``classes``, e.g. a model card's).

    ``region``: what a dense target explains, outlined on the image (`vizkit.viz.regions`): the
    target itself (``vk.targets.segment(cls, mask)``, ``depth_region``, ``depth_difference``,
    ``pixel(..., size=)``: its masks, named in the title) or a mask (H, W) / (B, H, W)."""
    check_display(result.maps, images, image)
    fig = go.Figure(
        heatmap_on_image(images[image], _scaled(result, image), name=result.method, value="min-max")
    )
    if region is not None:
        outline_regions(fig, region, image, images.shape[1:3])
    map_axes(fig)
    opacity_slider(fig)
    title = f"{result.method} saliency (min-max scaled), image {image}"
    title += _explained(result, image, classes) + _region_line(region, image)
    return finish(fig, title, 460)


def _region_line(region: Region | None, image: int) -> str:
    """A title's line naming ``region``'s outlines (`region_label`), or ""."""
    return "" if region is None else f"<br>{region_label(region, image)}"


def saliency_side_by_side(
    table: SaliencyTable,
    images: np.ndarray,
    image: int = 0,
    classes: Sequence[str] | None = None,
    region: Region | None = None,
) -> go.Figure:
    """Every method of a `compare_saliency` table on one image, each map min-max scaled, the
    image's scores in the panel titles (↑/↓: higher/lower is better) and the legend below
    naming only the scores computed; the title names the class explained (by name with
    ``classes``) and warns when the image's prediction is near chance (`SaliencyTable.caution`).
    ``region``: a dense target's region outlined on every panel, as `saliency_overlay`'s.
    """
    methods = list(table.results)
    if not methods:
        raise ValueError("The table holds no maps (every method was skipped); see table.notes.")
    explaining = [r for r in table.results.values() if r.targets is not None]
    explained = _explained(explaining[0], image, classes) if explaining else ""
    title = f"Saliency methods on image {image}{explained} (maps min-max scaled)"
    return side_by_side(table, images, image, title + _region_line(region, image), region=region)


PANELS_PER_ROW = 6  # more methods wrap onto further rows


def side_by_side(
    table: SaliencyTable,
    images: np.ndarray,
    image: int,
    title: str,
    methods: Sequence[str] | None = None,
    region: Region | None = None,
) -> go.Figure:
    """`saliency_side_by_side` under ``title`` (the `SaliencyComparer` numbers its images its
    own way), with the near-chance warning of ``image`` as a further line; ``methods``: the
    table's methods to show (default: every one that ran), `PANELS_PER_ROW` to a row;
    ``region``: outlined on every panel (`outline_regions`)."""
    methods = list(table.results) if methods is None else list(methods)
    skipped = [name for name in methods if name not in table.results]
    if skipped or not methods:
        raise ValueError(f"No maps of {skipped or methods} in the table; see table.notes.")
    for name in methods:
        check_display(table.results[name].maps, images, image)
    columns = min(len(methods), PANELS_PER_ROW)
    rows = [methods[i : i + columns] for i in range(0, len(methods), columns)]
    cells = [[(images[image], table.results[name].maps[image]) for name in row] for row in rows]
    per_line = 2 if columns <= 4 else 1  # narrow panels: one score a line (900 px, 6 panels)
    titles = [f"<b>{_wrapped(name)}</b><br>{_scores(table, name, image, per_line)}"
              for name in methods]  # fmt: skip
    lines = max(title.count("<br>") + 1 for title in titles)
    fig = overlay_grid(cells, subplot_titles=titles, horizontal_spacing=0.02,
                       vertical_spacing=(0.3 + 0.04 * lines) / len(rows))  # fmt: skip
    fig.update_annotations(font_size=MIN_FONT_SIZE)  # plotly's 16 px crowds the score lines
    if region is not None:
        for k in range(len(methods)):
            outline_regions(fig, region, image, images.shape[1:3], row=k // columns + 1,
                            col=k % columns + 1)  # fmt: skip
    opacity_slider(fig)
    fig.add_annotation(
        text=_legend(table), x=0, y=-0.08 / len(rows), xref="paper", yref="paper",
        showarrow=False, xanchor="left", yanchor="top",
    )  # fmt: skip
    fig.layout.sliders[0].pad.t += 20  # the opacity slider below that line
    caution = _near_chance(table, image)
    extra = 18 * max(0, lines - 3)  # title lines beyond the three the margin was made for
    extra += 25 * title.count("<br>")  # the figure's own title lines beyond its first
    finish(fig, title + caution, 480 + 300 * (len(rows) - 1) + (40 if caution else 0) + extra)
    fig.update_layout(margin={"t": (215 if caution else 160) + extra})
    return fig


def _wrapped(name: str) -> str:
    """A long method name broken after its underscores (``integrated_<br>gradients``)."""
    return name.replace("_", "_<br>") if len(name) > 14 else name


def saliency_row(
    result: SaliencyResult,
    images: np.ndarray,
    count: int = 4,
    classes: Sequence[str] | None = None,
    region: Region | None = None,
) -> go.Figure:
    """One method's maps on the first ``count`` images, side by side (min-max scaled); each
    title names the class explained (by name with ``classes``, e.g. a model card's);
    ``region``: each image's region outlined on it, as `saliency_overlay`'s."""
    check_display(result.maps, images, 0)
    shown = range(min(count, len(images)))
    titles = [f"image {i}" + _explained(result, i, classes).replace(", ", "<br>") for i in shown]
    fig = _overlay_row([images[i] for i in shown], [result.maps[i] for i in shown], titles)
    for i in shown if region is not None else ():
        outline_regions(fig, region, i, images.shape[1:3], row=1, col=i + 1)
    title = f"{result.method} saliency (min-max scaled per map)" + _region_line(region, 0)
    return finish(fig, title, 400)


def _explained(result: SaliencyResult, image: int, classes: Sequence[str] | None) -> str:
    """ ", explains <class>" for a result with targets, else ""."""
    if result.targets is None:
        return ""
    index = int(result.targets[image])
    name = classes[index] if classes is not None and index < len(classes) else f"class {index}"
    return f", explains {name}"


def _overlay_row(images: list[np.ndarray], maps: list, titles: list[str]) -> go.Figure:
    fig = overlay_grid([list(zip(images, maps, strict=True))], subplot_titles=titles,
                       horizontal_spacing=0.02)  # fmt: skip
    fig.update_annotations(font_size=MIN_FONT_SIZE)  # plotly's 16 px crowds the score lines
    return opacity_slider(fig)


def _scores(table: SaliencyTable, method: str, image: int, per_line: int = 2) -> str:
    """The image's scores of ``method``, ``per_line`` to a line."""
    values = table.per_image[table.methods.index(method), :, image].tolist()
    cells = [
        f"{METRICS[m].short} {v:.2f}"
        for m, v in zip(table.metrics, values, strict=True)
        if not math.isnan(v)
    ]
    lines = range(0, len(cells), per_line)
    return "<br>".join(" · ".join(cells[i : i + per_line]) for i in lines)


def _legend(table: SaliencyTable) -> str:
    """The short names of the scores in ``table`` (only those computed), with the curves'
    steps."""
    legend = ", ".join(
        f"{METRICS[m].short} = {m} {'↑' if METRICS[m].higher else '↓'}" for m in table.metrics
    )
    steps = table.options.get("steps")
    return legend + (f" (curves of {steps} steps)" if steps else "")


def _near_chance(table: SaliencyTable, image: int) -> str:
    """A red second title line when the prediction on ``image`` is near chance, else ""."""
    if table.near_chance is None or not bool(table.near_chance[image]):
        return ""
    probability = table.target_probability[image].item()
    entropy = table.prediction_entropy[image].item()
    return (
        f"<br><span style='color:#b2182b'>⚠ Prediction near chance (class explained p = "
        f"{probability:.3f}, softmax entropy {entropy:.2f} of max): these scores measure "
        "noise</span>"
    )


def _scaled(result: SaliencyResult, image: int):
    return min_max_scaled(result.maps[image])


def check_display(maps: Tensor, images: np.ndarray, image: int) -> None:
    """Refuse a clip's maps (B, T', h, w) (these figures draw one image a panel), ``image``
    out of range of the (B, h, w) ``maps``, or display ``images`` that are not one per map."""
    if maps.ndim == 4:
        raise ValueError(
            f"These maps are clips' (B, {maps.shape[1]}, h, w), and this figure draws one "
            "image's map a panel. Draw a clip's frames with vk.viz.video_saliency(result, "
            "vk.viz.display_images(x, model), clip=i), or explore them with "
            "vk.widgets.SaliencyComparer (a frame slider)."
        )
    if not -len(maps) <= image < len(maps):
        raise ValueError(f"image {image} is out of range: {len(maps)} maps.")
    if len(images) != len(maps):
        raise ValueError(
            f"{len(images)} display images for {len(maps)} maps; pass the images the maps were "
            "computed on (display_images(x, model))."
        )
