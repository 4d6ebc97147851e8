"""Saliency of a clip: its frames side by side, each with its map, on one colour scale."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis import SaliencyResult
from .overlay import heatmap_on_image, opacity_slider
from .saliency import _explained
from .style import MIN_FONT_SIZE, SALIENCY_SCALE, finish, map_axes

__all__ = ["video_saliency"]

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
    if count % len(maps):
        raise ValueError(f"{len(maps)} map frames do not divide the clip's {count} frames.")
    span = count // len(maps)  # input frames per map frame (the tubelet's depth for tokens)
    share = result.frame_shares()[clip].tolist()
    low, high = maps.min(), maps.max()
    scaled = (maps - low) / (high - low).clamp_min(1e-12)
    columns = min(count, FRAMES_PER_ROW)
    rows = -(-count // columns)
    titles = [f"frame {t}<br>{share[t // span] / span:.0%} of |map|" for t in range(count)]
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=titles,
                        horizontal_spacing=0.02, vertical_spacing=0.12 / rows)  # fmt: skip
    for t in range(count):
        for trace in heatmap_on_image(frames[clip, t], scaled[t // span], coloraxis="coloraxis"):
            fig.add_trace(trace, row=t // columns + 1, col=t % columns + 1)
    map_axes(fig)
    colorbar = {"title": {"text": "min-max<br>over clip"}}
    fig.update_layout(
        coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1, "colorbar": colorbar}
    )
    fig.update_annotations(font_size=MIN_FONT_SIZE)
    opacity_slider(fig)
    title = f"{result.method} saliency over clip {clip}{_explained(result, clip, classes)}"
    return finish(fig, title, 330 + 230 * (rows - 1))
