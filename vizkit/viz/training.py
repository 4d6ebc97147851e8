"""Training curves from a history (list of per-epoch records)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .style import finish, palette

__all__ = ["accuracy_over_seeds_figure", "epoch_accuracy_curves", "training_curves"]


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


def accuracy_over_seeds_figure(results: Mapping[str, dict], title: str) -> go.Figure:
    """Test accuracy per configuration: each seed as a dot, the mean with its sample std as a
    bar (``results`` maps a label to `vizkit.zoo.accuracy_over_seeds(prefix)`)."""
    labels = list(results)
    fig = go.Figure()
    fig.add_trace(
        go.Bar(x=labels, y=[r["mean"] for r in results.values()], name="mean",
               error_y={"type": "data", "array": [r["std"] for r in results.values()]},
               marker_color="#9ecae1")
    )  # fmt: skip
    for label, r in results.items():
        fig.add_trace(
            go.Scatter(x=[label] * len(r["accuracies"]), y=r["accuracies"], mode="markers",
                       marker={"color": "#08519c"}, showlegend=False,
                       text=[f"seed {s}" for s in r["seeds"]])
        )  # fmt: skip
    low = min(min(r["accuracies"]) for r in results.values())
    fig.update_yaxes(title_text="test top-1", tickformat=".0%", range=[max(0, low - 0.05), None])
    return finish(fig, title, 380)
