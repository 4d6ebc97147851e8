"""What every report section shares: the `Section` it returns, the `NotApplicable` it raises
when the model lacks what it shows, the checks that raise it, and the summary tables."""

from __future__ import annotations

import html
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import plotly.graph_objects as go

from ... import analysis
from ...hooks.scores import is_backbone
from ..inputs import ReportInputs

__all__ = [
    "NotApplicable",
    "Section",
    "has_self_attention",
    "html_table",
    "require_classes",
    "require_self_attention",
    "without_warnings",
]


@dataclass
class Section:
    """A titled part of the page: an explanation, figures, optional HTML (tables)."""

    title: str
    text: str
    figures: list[go.Figure] = field(default_factory=list)
    html: str = ""


class NotApplicable(Exception):
    """This section does not apply to this model (the message says why)."""


def require_classes(r: ReportInputs, why: str) -> None:
    """Raise NotApplicable for a backbone (embeddings, no class logits), saying ``why``."""
    if is_backbone(r.model):
        raise NotApplicable(
            f"{type(r.model).__name__} is a backbone: it returns embeddings, not classes, so {why}."
        )


def has_self_attention(r: ReportInputs) -> bool:
    """Whether the model has self-attention patterns (no forward pass)."""
    return bool(analysis.self_attention_names(r.hooked))


def require_self_attention(r: ReportInputs) -> None:
    """Raise NotApplicable for models without self-attention patterns (no forward pass)."""
    if not has_self_attention(r):
        raise NotApplicable(f"{type(r.model).__name__} has no self-attention patterns.")


def without_warnings(run: Callable):
    """``run()`` with its warnings silenced (the sections note what does not apply)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run()


def html_table(rows: dict[str, str]) -> str:
    """A two-column HTML table of ``rows`` (heading: value), escaped."""
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows.items()
    )
    return f"<table class='summary'>{cells}</table>"
