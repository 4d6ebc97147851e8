"""The sections of a report, in the page's order (`SECTIONS`): each runs one analysis on the
inputs and returns its `Section` of figures, or raises `NotApplicable` saying why it does not
apply to the model. One module per section or tight group; `base` holds what they share."""

from __future__ import annotations

from collections.abc import Callable

from ..inputs import ReportInputs
from .attention import attention, class_attention, rollout
from .base import NotApplicable, Section
from .concepts import concepts
from .evaluation import evaluation
from .features import sae_features
from .history import history
from .model import summary
from .predictions import predictions
from .representations import representations, residual_ratios
from .saliency import saliency

__all__ = ["SECTIONS", "NotApplicable", "Section", "add_section"]

SECTIONS: dict[str, Callable[[ReportInputs], Section]] = {
    "summary": summary,
    "predictions": predictions,
    "attention": attention,
    "rollout": rollout,
    "class_attention": class_attention,
    "saliency": saliency,
    "evaluation": evaluation,
    "representations": representations,
    "residual_ratios": residual_ratios,
    "features": sae_features,
    "concepts": concepts,
    "history": history,
}


def add_section(
    name: str, build: Callable[[ReportInputs], Section], before: str = "history"
) -> None:
    """Add a report section (a paper package's own) to `SECTIONS`, placed before ``before``."""
    if name in SECTIONS:
        raise ValueError(f"A report section {name!r} exists already.")
    items = list(SECTIONS.items())
    at = [key for key, _ in items].index(before)
    SECTIONS.clear()
    SECTIONS.update(items[:at] + [(name, build)] + items[at:])
