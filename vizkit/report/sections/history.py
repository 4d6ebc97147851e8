"""The training section: a zoo model's loss and accuracy per epoch from its card, and the
residual-norm ratios tracked during training where the card has them."""

from __future__ import annotations

from ... import viz
from ...train.history import tracked_results
from ..inputs import ReportInputs
from .base import NotApplicable, Section

__all__ = ["history"]


def history(r: ReportInputs) -> Section:
    records = r.card.get("history")
    if not records:
        raise NotApplicable("the model does not come from the zoo, so there is no history.")
    figures = [viz.training_curves(records, f"Training history of {r.name}")]
    if any("residual_ratios" in h for h in records):
        figures.append(viz.residual_ratio_curves(tracked_results(records, "residual_ratios")))
    return Section("Training", "Loss and accuracy per epoch from the model card.", figures)
