"""Training curves from a history (list of per-epoch records)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._style import finish, palette

__all__ = ["epoch_accuracy_curves", "training_curves"]


def _check_history(history: Sequence[dict]) -> None:
    if not history or "epoch" not in history[0]:
        raise ValueError(
            "history must be a non-empty list of per-epoch records (a card's 'history')."
        )


def training_curves(history: Sequence[dict], title: str = "Training history") -> go.Figure:
    """Loss (left) and accuracy (right) per epoch, train and test."""
    _check_history(history)
    epochs = [h["epoch"] for h in history]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["cross-entropy loss", "accuracy"])
    for col, quantity in ((1, "loss"), (2, "accuracy")):
        for split, dash in (("train", "dot"), ("test", "solid")):
            key = f"{split}_{quantity}"
            if key in history[0]:
                fig.add_trace(
                    go.Scatter(
                        x=epochs, y=[h[key] for h in history], name=key, mode="lines+markers",
                        line={"dash": dash, "color": "#1f77b4" if split == "test" else "#ff7f0e"},
                    ),
                    row=1, col=col,
                )  # fmt: skip
    fig.update_xaxes(title_text="epoch", dtick=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", tickformat=".0%", row=1, col=2)
    return finish(fig, title, 380)


def epoch_accuracy_curves(
    histories: Mapping[str, Sequence[dict]], title: str = "Test accuracy per epoch"
) -> go.Figure:
    """Several models' test accuracy per epoch on one plot (label -> a card's history)."""
    fig = go.Figure()
    for i, (label, history) in enumerate(histories.items()):
        _check_history(history)
        fig.add_trace(go.Scatter(
            x=[h["epoch"] for h in history], y=[h["test_accuracy"] for h in history],
            name=label, mode="lines+markers", line={"color": palette(i)},
        ))  # fmt: skip
    fig.update_xaxes(title_text="epoch", dtick=1)
    fig.update_yaxes(title_text="test accuracy", tickformat=".0%")
    return finish(fig, title, 380)
