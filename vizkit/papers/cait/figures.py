"""CaiT figures: class-attention heads of every CA layer (Fig. 6), the saliency gallery with the
classes above 10% (Fig. 7), talking-heads mixing matrices."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from ...analysis import SaliencyResult
from ...viz.overlay import photo
from ...viz.style import ATTENTION_SCALE, SALIENCY_SCALE, finish, map_axes, min_max_scaled
from .analysis import TalkingHeadsMixing

__all__ = ["class_attention_heads", "fig7_gallery", "talking_heads_matrices"]


def class_attention_heads(
    layers: Sequence[SaliencyResult], images: np.ndarray, image: int = 0
) -> go.Figure:
    """Fig. 6: one row per class-attention layer, one panel per head (``per_head`` of
    `class_attention(model, x, layer=j)`), the image first; each map min-max scaled."""
    heads = layers[0].extras["per_head"].shape[1]
    fig = make_subplots(
        rows=len(layers), cols=heads + 1, horizontal_spacing=0.015, vertical_spacing=0.08,
        column_titles=["image"] + [f"head {h}" for h in range(heads)],
        row_titles=[f"CA layer {j + 1}" for j in range(len(layers))],
    )  # fmt: skip
    for j, result in enumerate(layers):
        if j == 0:
            fig.add_trace(photo(images[image], hoverinfo="skip"), row=1, col=1)
        maps = result.extras["per_head"][image].float().cpu()
        for h in range(heads):
            m = maps[h]
            fig.add_trace(
                go.Heatmap(z=min_max_scaled(m).numpy(),
                           coloraxis="coloraxis"),
                row=j + 1, col=h + 2,
            )  # fmt: skip
    map_axes(fig)
    fig.update_layout(coloraxis={"colorscale": ATTENTION_SCALE, "colorbar": {"title": "min-max"}})
    return finish(
        fig, f"Class attention per head, image {image} (CaiT Fig. 6)", 170 * len(layers) + 90
    )


def fig7_gallery(
    modulated: SaliencyResult,
    probabilities: Tensor,
    classes: Sequence[str],
    threshold: float = 0.1,
    columns: int = 4,
) -> go.Figure:
    """Fig. 7: each image's grey level modulated by its first-CA-layer saliency (`modulated_gray`),
    in cividis, titled with every class above ``threshold`` probability."""
    maps = modulated.maps.float().cpu()
    count = len(maps)
    titles = []
    for p in probabilities.float().cpu():
        above = [(classes[k], v) for k, v in enumerate(p.tolist()) if v > threshold]
        above.sort(key=lambda item: -item[1])
        titles.append(", ".join(f"{name} ({v:.0%})" for name, v in above))
    rows = -(-count // columns)
    fig = make_subplots(rows=rows, cols=min(columns, count), subplot_titles=titles,
                        vertical_spacing=0.1, horizontal_spacing=0.02)  # fmt: skip
    for i in range(count):
        fig.add_trace(go.Heatmap(z=maps[i].numpy(), coloraxis="coloraxis"),
                      row=i // columns + 1, col=i % columns + 1)  # fmt: skip
    map_axes(fig)
    fig.update_annotations(font_size=12)
    fig.update_layout(coloraxis={"colorscale": SALIENCY_SCALE, "cmin": 0, "cmax": 1})
    title = (
        "Regions of focus of the first class-attention layer (CaiT Fig. 7; classes above "
        f"{threshold:.0%})"
    )
    return finish(fig, title, 230 * rows + 80)


def talking_heads_matrices(mixing: TalkingHeadsMixing) -> go.Figure:
    """The talking-heads mixing matrices of every self-attention block (`talking_heads`): P_l
    (before the softmax, top) and P_w (after it, bottom); rows = output head, columns = input
    head."""
    blocks = [name.split(".")[1] for name in mixing.layers]
    titles = [f"block {i} P_l" for i in blocks] + [f"block {i} P_w" for i in blocks]
    fig = make_subplots(rows=2, cols=len(blocks), vertical_spacing=0.12,
                        horizontal_spacing=0.02, subplot_titles=titles)  # fmt: skip
    for row, weights in ((1, mixing.pre_softmax), (2, mixing.post_softmax)):
        for col, weight in enumerate(weights.float().numpy(), start=1):
            fig.add_trace(go.Heatmap(z=weight, coloraxis="coloraxis"), row=row, col=col)
    map_axes(fig)
    fig.update_layout(
        coloraxis={"colorscale": "RdBu_r", "cmid": 0, "colorbar": {"title": "weight"}}
    )
    return finish(fig, "Talking-heads mixing (identity = plain multi-head attention)", 420)
