"""ACDC (Conmy et al. 2023, "Towards Automated Circuit Discovery for Mechanistic
Interpretability", Algorithm 1): from the whole graph, visit the inputs from the output
backwards and each input's edges in turn; remove an edge (patch it with the reference run)
when the circuit without it is at most ``threshold`` worse than with it, and keep it removed.
One run of the batch per edge tried: exact, and slow where attribution patching is one
backward, so it is the baseline on small models.

Worse is measured by ``metric``: "kl", the mean KL divergence of the circuit's class
distribution from the model's (the paper's default), or "score", the distance of the mean
score from the model's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.component_edits import RunScore
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice
from ..hooks.scores import model_logits
from .circuit import Circuit
from .patched_runs import CircuitRuns

__all__ = ["ACDC_METRICS", "acdc"]

ACDC_METRICS = ("kl", "score")


@analysis_contract
def acdc(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    threshold: float = 0.01,
    metric: str = "kl",
    target: Target = None,
    versus: Target = None,
    heads: bool = True,
    progress: bool = True,
) -> Circuit:
    """The circuit ACDC finds, edges outside it reading the ``corrupted`` run (B images, one
    per clean image, or one for all).

    Args:
        threshold: the most one removal may worsen the metric.
        metric: "kl" (of the class distributions; a classifier) or "score" (target and
            versus as `attribution_patching`, or a score target).
        heads: a node per attention head (False: each block's attention as one node).

    Returns:
        `Circuit`; its ``scores`` (U, D): how much removing each edge worsened the metric
        when it was tried (NaN where u does not feed d); ``options["runs"]``: forwards made.
    """
    check_choice("metric", metric, ACDC_METRICS)
    if not threshold >= 0:
        raise ValueError(f"threshold must be at least 0; got {threshold}.")
    runs = CircuitRuns(model, clean, corrupted, heads)
    loss = _loss(runs.clean_output, metric, target, versus, len(runs.x))
    feeds = runs.graph.edges()
    kept = feeds.clone()
    worsened = torch.full(feeds.shape, torch.nan)
    current = loss(runs.output(kept))
    order = [(u, d) for d in reversed(range(feeds.shape[1]))
             for u in reversed(range(feeds.shape[0])) if feeds[u, d]]  # fmt: skip
    for u, d in tqdm(order, desc="acdc", disable=not progress, leave=False):
        kept[u, d] = False
        trial = loss(runs.output(kept))
        worsened[u, d] = trial - current
        if trial - current <= threshold:
            current = trial
        else:
            kept[u, d] = True
    graph = runs.graph
    return Circuit(
        graph.upstream, graph.downstream, kept, worsened,
        options={"method": "acdc", "threshold": threshold, "metric": metric,
                 "runs": len(order) + 3, "loss": current},
    )  # fmt: skip


def _loss(
    clean_output: object, metric: str, target: Target, versus: Target, batch: int
) -> Callable[[object], float]:
    """The metric of a circuit's output on ``batch`` images against the model's (lower is
    better)."""
    if metric == "kl":
        logits = model_logits(clean_output)
        if not isinstance(logits, Tensor) or logits.ndim != 2:
            raise ValueError(
                "metric='kl' compares class distributions, and this model's output has none "
                "(a backbone); use metric='score' with a score target (vk.targets)."
            )
        expected = logits.float().log_softmax(-1)

        def kl(output: object) -> float:
            got = model_logits(output).float().log_softmax(-1)
            return float(F.kl_div(got, expected, log_target=True, reduction="batchmean"))

        return kl
    score = RunScore.of(clean_output, target, versus)
    rows = torch.arange(batch)
    reference = score(clean_output, rows).mean()
    return lambda output: float((score(output, rows).mean() - reference).abs())
