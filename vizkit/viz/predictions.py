"""The images with the model's predictions, or a warning where a prediction is near chance."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

from ..metrics.chance import Predictions
from .overlay import photo
from .style import finish

__all__ = ["predictions_figure"]

_CAUTION = "#b2182b"


def predictions_figure(images: np.ndarray, predictions: Predictions, columns: int = 8) -> go.Figure:
    """Each image with its top class and probability (green: correct, red: wrong, with labels).
    An image whose prediction is near chance (`Predictions.near_chance`: a near-uniform
    softmax, or a top class with a tiny probability) names no class: its title says "near
    chance" and the figure's title counts such images.

    Args:
        images: display images (B, H, W, 3) uint8.
        predictions: the model's on those images (`vizkit.metrics.predictions(logits, labels,
            classes)`); classes are shown by index where its names are not one per class.
    """
    p = predictions.probabilities
    if len(images) != len(p):
        raise ValueError(f"{len(images)} images but {len(p)} predictions.")
    count, names, labels = p.shape[1], predictions.names, predictions.labels
    chance = predictions.near_chance.tolist()
    top_p, top = predictions.top
    titles = [
        _title(names, int(top[i]), float(top_p[i]), count, chance[i], _label(labels, i))
        for i in range(len(images))
    ]
    rows = -(-len(images) // columns)
    cols = min(columns, len(images))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.12)
    for i, image in enumerate(images):
        fig.add_trace(photo(image, hoverinfo="skip"), row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.update_annotations(font_size=11)
    title = "Predictions (top class and its probability)" + _summary(predictions)
    return finish(fig, title, 160 + 150 * rows)


def _label(labels: Tensor | None, image: int) -> int | None:
    return None if labels is None else int(labels[image])


def _name(names: list[str] | None, index: int) -> str:
    return names[index] if names is not None else str(index)


def _title(
    names: list[str] | None, top: int, p: float, count: int, chance: bool, label: int | None
) -> str:
    """One image's title: its top class and probability, or "near chance" and the top
    probability beside the uniform 1/K; the true class with labels."""
    truth = "" if label is None else f"<br>true {_name(names, label)}"
    if chance:
        text = f"near chance<br>top p {p:.2g} (1/K {1 / count:.2g})"
        return f"<span style='color:{_CAUTION}'>{text}</span>{truth}"
    text = f"{_name(names, top)} {p:.2f}"
    if label is None:
        return text
    ok = label == top
    return f"<span style='color:{'green' if ok else 'red'}'>{text}</span>" + ("" if ok else truth)


def _summary(predictions: Predictions) -> str:
    """Second title lines: how many predictions are near chance, and why names are not used."""
    lines = []
    chance, classes = predictions.near_chance, predictions.classes
    count = predictions.probabilities.shape[1]
    if bool(chance.any()):
        top = predictions.top[0][chance]
        lines.append(
            f"<span style='color:{_CAUTION}'>⚠ near chance on {int(chance.sum())} of "
            f"{len(chance)} images (top p ≤ {float(top.max()):.2g}, softmax entropy ≥ "
            f"{float(predictions.entropy[chance].min()):.2f} of its max): no class is "
            "predicted</span>"
        )
    if classes is not None and len(classes) != count:
        lines.append(f"{len(classes)} class names for {count} classes: classes shown by index")
    return "".join(f"<br>{line}" for line in lines)
