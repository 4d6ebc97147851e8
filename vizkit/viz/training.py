"""Training curves from a history (list of per-epoch records)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..ledger import HELD, INCONCLUSIVE, NOT_HELD
from .style import finish, palette

__all__ = [
    "accuracy_over_seeds_figure",
    "epoch_accuracy_curves",
    "scale_trend",
    "training_curves",
]


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
    """Test accuracy per configuration: each seed as a dot, the mean as a bar-wide tick with its
    sample std as error bar (``results`` maps a label to
    `vizkit.ledger.accuracy_over_seeds(prefix)`). The axis spans the data, not 0-100 %: seeds a
    few tenths of a point apart near the ceiling stay apart."""
    labels = list(results)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=labels, y=[r["mean"] for r in results.values()], name="mean ± std",
                   mode="markers", marker={"symbol": "line-ew-open", "size": 40, "color": "#6baed6",
                                           "line": {"width": 3}},
                   error_y={"type": "data", "array": [r["std"] for r in results.values()],
                            "color": "#6baed6", "thickness": 2})
    )  # fmt: skip
    for label, r in results.items():
        fig.add_trace(
            go.Scatter(x=[label] * len(r["accuracies"]), y=r["accuracies"], mode="markers",
                       marker={"color": "#08519c"}, showlegend=False,
                       text=[f"seed {s}" for s in r["seeds"]])
        )  # fmt: skip
    known = [r for r in results.values() if not math.isnan(r["std"])]  # NaN: one seed
    values = [a for r in results.values() for a in r["accuracies"]]
    values += [r["mean"] + sign * r["std"] for r in known for sign in (-1, 1)]
    margin = max(0.005, 0.1 * (max(values) - min(values)))
    fig.update_yaxes(title_text="test top-1", tickformat=".1%",
                     range=[min(values) - margin, max(values) + margin])  # fmt: skip
    return finish(fig, title, 380)


VERDICT_COLORS = {HELD: "#2166ac", NOT_HELD: "#e66101", INCONCLUSIVE: "#7f7f7f"}


def scale_trend(points: Sequence[Mapping], title: str, unit: str = "points") -> go.Figure:
    """One claim's contrast over training budgets, smallest first: a marker per budget with its
    2 SE as error bar, coloured by the verdict at that budget (blue held, orange not held, grey
    inconclusive), and the zero line where the claim turns. A budget whose spread is unknown
    (``two_se`` NaN: one run) has a hollow marker and no error bar.

    Args:
        points: mappings with ``budget`` (its label, e.g. "40 epochs"; distinct), ``value``
            (the contrast, positive in the paper's direction), ``two_se`` (>= 0 or NaN) and
            ``verdict`` ("held", "not held" or "inconclusive").
        unit: what ``value`` is measured in (the y axis).
    """
    if not points:
        raise ValueError("scale_trend needs at least one budget's point.")
    unknown = {p["verdict"] for p in points} - VERDICT_COLORS.keys()
    if unknown:
        raise ValueError(f"Unknown verdicts {sorted(unknown)}; known: {list(VERDICT_COLORS)}.")
    budgets = [str(p["budget"]) for p in points]
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"Each budget is drawn once; got the labels {budgets}.")
    values = [float(p["value"]) for p in points]
    errors = [float(p.get("two_se", math.nan)) for p in points]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"The contrasts must be finite; got {values}.")
    if any(e < 0 or math.isinf(e) for e in errors):
        raise ValueError(f"two_se must be >= 0 and finite, or NaN if unknown; got {errors}.")
    known = [not math.isnan(e) for e in errors]
    fig = go.Figure()
    fig.add_hline(y=0, line={"color": "#444", "dash": "dash", "width": 1})
    fig.add_trace(go.Scatter(
        x=budgets, y=values, mode="lines+markers", showlegend=False,
        line={"color": "#bbbbbb"},
        marker={"size": 11, "color": [VERDICT_COLORS[p["verdict"]] for p in points],
                "symbol": ["circle" if k else "circle-open" for k in known],
                "line": {"width": 2, "color": [VERDICT_COLORS[p["verdict"]] for p in points]}},
        error_y={"type": "data", "array": [0 if math.isnan(e) else e for e in errors],
                 "visible": any(known), "color": "#555"},
        customdata=[[p["verdict"], f"2 SE {e:.2f}" if k else "spread unknown"]
                    for p, e, k in zip(points, errors, known, strict=True)],
        hovertemplate="%{x}: %{y:+.2f} " + unit + " (%{customdata[1]}; %{customdata[0]})"
                      "<extra></extra>",
    ))  # fmt: skip
    for verdict, color in VERDICT_COLORS.items():  # the legend: the verdicts drawn
        if any(p["verdict"] == verdict for p in points):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=verdict,
                                     marker={"size": 11, "color": color}))  # fmt: skip
    fig.update_xaxes(title_text="training budget", type="category")
    fig.update_yaxes(title_text=f"contrast ({unit}; + as the paper)", zeroline=False)
    return finish(fig, title, 320)
