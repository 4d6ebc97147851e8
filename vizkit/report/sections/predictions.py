"""The predictions section: the model's top classes per image, with a caution where the
predictions are near chance."""

from __future__ import annotations

import html

import torch
from torch import Tensor

from ... import metrics, viz
from ..inputs import ReportInputs
from .base import Section, require_classes

__all__ = ["predictions"]


def predictions(r: ReportInputs) -> Section:
    require_classes(r, "there is no predicted class to show")
    with torch.no_grad():
        logits = r.hooked(r.images)
    predicted = metrics.predictions(logits, r.labels, r.classes)
    figure = viz.predictions_figure(viz.display_images(r.images, r.model), predicted)
    note = f" Note: {r.class_note}." if r.class_note else ""
    caution = _chance_caution(predicted.near_chance, r.card.get("weights") == "random")
    return Section("Predictions", "The model's top class per image." + note, [figure], caution)


def _chance_caution(chance: Tensor, random_weights: bool) -> str:
    """A warning paragraph when predictions are near chance ("" when none is); ``chance`` (B,)
    bool, per image."""
    flagged = int(chance.sum())
    if not flagged:
        return ""
    why = (
        "the model has random weights"
        if random_weights
        else "the model is untrained, or the images are unlike its training data"
    )
    text = (
        f"⚠ The predictions on {flagged} of {len(chance)} images are near chance (a near-uniform "
        f"softmax, or a top class with a tiny probability): {why}, so no class is predicted "
        "there, and deletion and insertion scores of explanations of those images measure noise."
    )
    return f"<p class='caution'>{html.escape(text)}</p>"
