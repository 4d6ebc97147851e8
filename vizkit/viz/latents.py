"""Figures of a sparse autoencoder's latents: their activation over images."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from .overlay import heatmap_on_image
from .style import SALIENCY_SCALE, finish

__all__ = ["latent_maps_figure"]


def latent_maps_figure(
    maps: Tensor, images: np.ndarray, latents: Sequence[int], layer: str,
    notes: Sequence[str] | None = None,
) -> go.Figure:  # fmt: skip
    """A row per latent, a column per image: each latent's activation (`vk.sae.latent_maps`,
    (B, L, gh, gw)) over each image (B, H, W, 3 uint8), on one colour axis from 0. ``notes``:
    a word per latent for its row title (e.g. the class it raises most)."""
    count, rows = maps.shape[:2]
    if rows != len(latents) or count != len(images):
        raise ValueError(
            f"maps {tuple(maps.shape)} must be (images, latents) = ({len(images)}, "
            f"{len(latents)}, gh, gw)."
        )
    fig = make_subplots(rows=rows, cols=count, horizontal_spacing=0.01, vertical_spacing=0.03,
                        column_titles=[f"image {i}" for i in range(count)])  # fmt: skip
    for r in range(rows):
        for c in range(count):
            for trace in heatmap_on_image(images[c], maps[c, r], coloraxis="coloraxis",
                                          name=f"latent {latents[r]}"):  # fmt: skip
                fig.add_trace(trace, row=r + 1, col=c + 1)
        note = f"<br>{notes[r]}" if notes is not None else ""
        fig.update_yaxes(title_text=f"latent {latents[r]}{note}", row=r + 1, col=1)
    fig.update_xaxes(showticklabels=False, showgrid=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, autorange="reversed")
    for n in range(rows * count):
        fig.layout[f"yaxis{n + 1 if n else ''}"].scaleanchor = f"x{n + 1 if n else ''}"
    top = max(float(maps.max()), 1e-6)
    fig.update_layout(coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": top,
                                 "colorbar": {"title": {"text": "activation"}}})  # fmt: skip
    return finish(fig, f"Latents of {layer}: their activation on each patch", 110 + 120 * rows)
