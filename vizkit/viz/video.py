"""Saliency of a clip: its frames side by side, each with its map, on one colour scale."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from ..analysis import SaliencyResult
from .overlay import heatmap_on_image, opacity_slider
from .saliency import _explained
from .style import MIN_FONT_SIZE, SALIENCY_SCALE, finish, map_axes

__all__ = ["clip_cell", "clip_grid", "map_frame", "video_saliency"]

FRAMES_PER_ROW = 8  # longer clips wrap onto further rows


def video_saliency(
    result: SaliencyResult,
    frames: np.ndarray,
    clip: int = 0,
    classes: Sequence[str] | None = None,
) -> go.Figure:
    """One clip's maps over its frames (B, T, H, W, 3 uint8, e.g. ``LoadedVideos.shown`` or
    `display_images` of the clips), min-max scaled over the whole clip so that frames compare;
    a token frame's map lies over each of the input frames it spans (its tubelet). Each title
    gives the frame's share of the clip's |map|."""
    if result.frames is None:
        raise ValueError(
            f"These {result.method} maps are of images (B, h, w), not of clips; "
            "vk.viz.saliency_overlay shows them."
        )
    if frames.ndim != 5 or len(frames) != len(result.maps):
        raise ValueError(
            f"frames must be the clips' frames (B, T, H, W, 3), one clip per map "
            f"({len(result.maps)}); got shape {frames.shape}."
        )
    if not -len(frames) <= clip < len(frames):
        raise ValueError(f"clip {clip} is out of range: {len(frames)} clips.")
    count, maps = frames.shape[1], result.maps[clip].detach().float().cpu()
    share = result.frame_shares()[clip].tolist()
    if count % len(maps):
        raise ValueError(f"{len(maps)} map frames do not divide the clip's {count} frames.")
    span = count // len(maps)  # input frames per map frame (the tubelet's depth for tokens)
    titles = [f"frame {t}<br>{share[t // span] / span:.0%} of |map|" for t in range(count)]
    low, high = maps.min(), maps.max()
    scaled = (maps - low) / (high - low).clamp_min(1e-12)
    coloraxis = {"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1,
                 "colorbar": {"title": {"text": "min-max<br>over clip"}}}  # fmt: skip
    fig = clip_grid(frames[clip], [scaled], titles, coloraxis)
    title = f"{result.method} saliency over clip {clip}{_explained(result, clip, classes)}"
    return finish(fig, title)


def map_frame(frame: int, count: int, map_frames: int) -> int:
    """The frame of a clip's maps (``map_frames`` of them: token frames T', or the T input frames
    of a pixel map) that input frame ``frame`` of ``count`` lies in."""
    if count % map_frames:
        raise ValueError(f"{map_frames} map frames do not divide the clip's {count} frames.")
    return frame // (count // map_frames)


def clip_cell(clip: int, frame: int, count: int) -> dict[str, int]:
    """The subplot (``row``, ``col``) of `clip_grid` that shows frame ``frame`` of its clip map
    ``clip`` (of a clip of ``count`` frames)."""
    columns = min(count, FRAMES_PER_ROW)
    rows = -(-count // columns)
    return {"row": clip * rows + frame // columns + 1, "col": frame % columns + 1}


def clip_grid(
    frames: np.ndarray, maps: Sequence[Tensor], titles: Sequence[str], coloraxis: dict
) -> go.Figure:
    """One clip's frames (T, H, W, 3 uint8) side by side, once for each map of ``maps`` (each
    (T', h, w) or (T, h, w), over its frames: a token frame's map over each frame of its
    tubelet), `FRAMES_PER_ROW` to a row; every map on one colour axis (``coloraxis``: its scale,
    range and colour bar, as the caller scaled the maps); ``titles``: one per panel, clip map by
    clip map. Axes as `map_axes`, the subplot titles at `MIN_FONT_SIZE`, an opacity slider; the
    height grows with the rows of panels and the lines of their titles."""
    count = len(frames)
    columns = min(count, FRAMES_PER_ROW)
    rows = -(-count // columns) * len(maps)
    lines = max(title.count("<br>") for title in titles)  # beyond each title's first
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=list(titles),
                        horizontal_spacing=0.02,
                        vertical_spacing=(0.12 + 0.06 * lines) / rows)  # fmt: skip
    fig.layout.height = 330 + 230 * (rows - 1) + 18 * lines * rows
    for k, values in enumerate(maps):
        for t in range(count):
            shown = values[map_frame(t, count, len(values))]
            for trace in heatmap_on_image(frames[t], shown, coloraxis="coloraxis"):
                fig.add_trace(trace, **clip_cell(k, t, count))
    map_axes(fig).update_yaxes(constraintoward="top")  # each frame right under its title
    fig.update_layout(coloraxis=coloraxis)
    fig.update_annotations(font_size=MIN_FONT_SIZE)
    return opacity_slider(fig)
