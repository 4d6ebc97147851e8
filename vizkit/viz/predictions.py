"""The images with the model's predictions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from .style import finish

__all__ = ["predictions_figure"]


def predictions_figure(
    images: np.ndarray,
    probabilities: Tensor,
    labels: Tensor | None = None,
    classes: Sequence[str] | None = None,
    columns: int = 8,
) -> go.Figure:
    """Each image with its top class and probability (green: correct, red: wrong, with labels).

    Args:
        images: display images (B, H, W, 3) uint8; probabilities: (B, K) softmax outputs.
    """
    if len(images) != len(probabilities):
        raise ValueError(f"{len(images)} images but {len(probabilities)} predictions.")
    top_p, top = probabilities.float().cpu().max(1)
    names = (
        list(classes) if classes is not None else [str(k) for k in range(probabilities.shape[1])]
    )
    titles = []
    for i in range(len(images)):
        text = f"{names[int(top[i])]} {top_p[i]:.2f}"
        if labels is not None:
            ok = int(labels[i]) == int(top[i])
            color = "green" if ok else "red"
            text = f"<span style='color:{color}'>{text}</span>" + (
                "" if ok else f"<br>true {names[int(labels[i])]}"
            )
        titles.append(text)
    rows = -(-len(images) // columns)
    cols = min(columns, len(images))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.12)
    for i, image in enumerate(images):
        fig.add_trace(go.Image(z=image), row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.update_annotations(font_size=11)
    return finish(fig, "Predictions (top class and its probability)", 140 + 150 * rows)
