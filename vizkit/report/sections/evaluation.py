"""The evaluation section ("Can these explanations be trusted?"): the randomization test of
the default saliency methods, the faithfulness scores the comparison does not show, with
standard errors, and each method's ROAD curves."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ... import viz
from ...analysis import SaliencyResult
from ...analysis.saliency_result import constant_maps
from ...hooks.scores import model_logits
from ...methods.registry import default_methods
from ...metrics import evaluate, road, sanity_check
from ...metrics.compare import resolve_methods
from ...metrics.road import ORDERS
from ..inputs import ReportInputs
from .base import Section, has_self_attention, require_classes, without_warnings
from .saliency_methods import report_methods

__all__ = ["EVALUATION", "evaluation"]

# what the evaluation section adds to the comparison's deletion, insertion and mask scores
EVALUATION = ("road_morf_auc", "average_drop", "faithfulness_correlation", "sparseness")


def evaluation(r: ReportInputs) -> Section:
    """The sanity check (cascading randomization) of the default methods, and the metrics the
    comparison does not show, with standard errors."""
    require_classes(
        r,
        "the further faithfulness scores (ROAD, average drop, faithfulness correlation) score "
        "a class's probability; vk.sanity_check(model, x, target=vk.targets.embedding_norm()) "
        "runs the randomization test on it",
    )
    has_attention = has_self_attention(r)
    names = [n for n in default_methods(has_attention) if n != "integrated_gradients"]
    methods = report_methods(has_attention)
    checks, refused = [], []
    for name in names:
        try:
            check = partial(sanity_check, r.hooked, r.images, name, progress=False)
            checks.append(without_warnings(check))
        except ValueError:  # the method does not apply to this model (rollout on CaiT)
            refused.append(name)
    targets = "labels" if r.labels is not None else "predictions"
    data = (r.images, r.labels if r.labels is not None else _predicted_classes(r))
    table = without_warnings(lambda: evaluate(r.hooked, data, methods, list(EVALUATION),
        batch_size=len(r.images), targets=targets, progress=False))  # fmt: skip
    curves = without_warnings(lambda: _road_curves(r, methods, data[1]))
    return Section(
        "Can these explanations be trusted?",
        "Above: the model-parameter randomization test (Adebayo et al. 2018): the layers are "
        "re-initialized from the top down, on a copy, and each method's maps compared with the "
        "trained model's (Spearman of |map|); a method whose maps stay the same does not "
        "explain the model (the random baseline is the control). Below: further faithfulness "
        "scores over the same images (ROAD with noisy linear imputation, average drop, "
        "faithfulness correlation) and sparseness, then each method's ROAD curves: the "
        "class's probability as the most (MoRF) or least (LeRF) relevant pixels are removed "
        "and imputed. Integrated gradients is left out of the "
        "randomization test for its cost"
        + (f", and {', '.join(refused)} (which do not apply to this model)" if refused else "")
        + ". vk.sanity_check and vk.evaluate run them on your data.",
        [*([viz.sanity_curves(checks)] if checks else []), viz.evaluation_bars(table),
         *([viz.curve_comparison(curves)] if curves else [])],
    )  # fmt: skip


def _road_curves(r: ReportInputs, methods: list, targets: Tensor) -> dict:
    """Each method's ROAD MoRF and LeRF curves on the report's images whose map is not
    constant (as the evaluation, which leaves those unscored; the name says how many); methods
    that refuse the model are left out. ``targets`` (B,): the classes explained."""
    curves = {}
    for name, fn in resolve_methods(methods, r.hooked):
        try:
            result = fn(r.hooked.model, r.images, targets)
        except ValueError:
            continue
        maps = result.maps if isinstance(result, SaliencyResult) else result
        keep = (~constant_maps(maps)).nonzero()[:, 0].to(r.images.device)
        if len(keep) < len(maps):
            name = f"{name} ({len(keep)} of {len(maps)} images)"
        if len(keep):
            kept = (r.images[keep], maps[keep.to(maps.device)], targets[keep.to(targets.device)])
            curves[name] = [road(r.hooked, *kept, order=o) for o in ORDERS]
    return curves


def _predicted_classes(r: ReportInputs) -> Tensor:
    """(B,) the model's classes for the report's images."""
    with torch.no_grad():
        return model_logits(r.hooked(r.images)).argmax(-1)
