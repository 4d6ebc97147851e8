"""The attention sections: the attention maps themselves (one query in every layer and head,
and per-layer statistics), attention rollout, and the class token's attention as saliency."""

from __future__ import annotations

from ... import analysis, viz
from ...analysis import SaliencyResult
from ...methods.registry import registered
from ..inputs import ReportInputs
from .base import NotApplicable, Section, require_self_attention

__all__ = ["attention", "class_attention", "rollout"]


def attention(r: ReportInputs) -> Section:
    result = _attention_maps(r)
    last = result[-1] if isinstance(result, analysis.Stages) else result
    images = viz.display_images(r.images, r.model)
    return Section(
        "Attention",
        "Post-softmax attention of one query (the class token, or the centre patch) in every "
        "layer (of a hierarchical model: of its last stage) and head of image 0, the same "
        "query's head-averaged row over the image, and per-layer statistics over all images "
        "(of every stage, where they fit in memory).",
        [
            viz.attention_grid(last, images=images),
            viz.query_attention(last, images),
            viz.attention_stats_figure(result),
        ],
    )


def rollout(r: ReportInputs) -> Section:
    require_self_attention(r)
    try:
        result = registered("rollout")(r.hooked, r.images, allow_non_stochastic=True)
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    return _overlays(r, "Attention rollout", "Abnar & Zuidema's rollout of the class token "
                     "where the head reads it (else of the mean patch, or through an "
                     "attention-pooling head) through every layer.", result)  # fmt: skip


def class_attention(r: ReportInputs) -> Section:
    require_self_attention(r)
    try:
        result = registered("class_attention")(r.hooked, r.images)
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    return _overlays(r, "Class-attention saliency", "The class token's attention over the "
                     "patches (CaiT Fig. 6/7), heads averaged.", result)  # fmt: skip


def _attention_maps(r: ReportInputs) -> analysis.AttentionResult | analysis.Stages:
    """Every self-attention layer's maps (`Stages` for a hierarchical model); its last stage's
    where every stage would not fit in memory (an early stage's window maps in image space are
    Np x Np per head)."""
    try:
        return analysis.attention(r.hooked, r.images)
    except ValueError:
        pass
    try:
        layers = analysis.stage_layers(r.hooked, tuple(r.images.shape[-2:]))
        return analysis.attention(r.hooked, r.images, layers=layers)
    except ValueError as error:
        raise NotApplicable(str(error)) from error


def _overlays(r: ReportInputs, title: str, text: str, result: SaliencyResult) -> Section:
    """A section of ``result``'s maps over the first four images."""
    images = viz.display_images(r.images, r.model)
    return Section(title, text, [viz.saliency_row(result, images, count=4, classes=r.classes)])
