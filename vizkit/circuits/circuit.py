"""A circuit: the edges of the component graph kept, every other edge patched, and how much of
the model's score the circuit alone recovers as it grows (its faithfulness curve).

A run of a circuit (Conmy et al. 2023, "Towards Automated Circuit Discovery", Sec. 2): each
input d reads, from a node u whose edge (u, d) is not in the circuit, u's output on a
reference run (the corrupted image, or the mean over the corrupted images) instead of its
output in this run. So with every edge kept the run is the model's; with none, every input
reads the reference. Faithfulness of a circuit C (Mueller et al. 2025, "MIB: A Mechanistic
Interpretability Benchmark", Sec. 3): (M(C) - M(none)) / (M(model) - M(none)), scores averaged
over the images; the curve over circuit sizes gives CPR (its area, higher is better) and CMD
(the area between it and 1, lower is better).

A head's output in the run is read through its block's `vizkit.head_outputs.ProjectionMap`
(what the heads' slice of the projection input writes), measured and checked per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.component_edits import RunScore
from ..analysis.result import Result
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from .attribution import AttributionResult
from .patched_runs import CircuitRuns

__all__ = ["Circuit", "FaithfulnessCurve", "circuit", "faithfulness"]


@dataclass(repr=False)
class Circuit(Result):
    """The edges kept of a component graph (by heads or by blocks).

    Attributes:
        upstream, downstream: the graph's node and input names (`ComponentGraph`).
        edges: (U, D) bool, the edges kept.
        scores: (U, D) the mean effects they were chosen by (NaN where u does not feed d).
    """

    upstream: list[str]
    downstream: list[str]
    edges: Tensor
    scores: Tensor
    options: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.edges.sum())

    def node_effects(self) -> Tensor:
        """(U,) each node's summed score over its edges in the circuit."""
        return torch.where(self.edges, self.scores.nan_to_num(), 0.0).sum(1)

    def nodes(self) -> list[str]:
        """The upstream nodes with an edge kept, in graph order."""
        return [name for name, kept in zip(self.upstream, self.edges.any(1), strict=True) if kept]

    def run(
        self, model: nn.Module | HookedModel, x: Tensor, reference: Tensor,
        target: Target = None, versus: Target = None,
    ) -> Tensor:  # fmt: skip
        """(B,) the score on images x (B, C, H, W) with every edge outside the circuit reading
        its node's output on ``reference`` (B images, one per image of x, or one image for all)
        instead; target and versus as `attribution_patching` (default: x's predictions)."""
        return _circuit_scores(model, x, reference, [self.edges], target, versus, _by_heads(self))[
            0
        ]


def circuit(result: AttributionResult, size: int | float) -> Circuit:
    """The circuit of the ``size`` edges (an int) or share of edges (a float in (0, 1]) with
    the largest mean effect by magnitude in ``result``."""
    scores = result.edges.mean(0)
    valid = ~scores.isnan()
    count = int(valid.sum())
    if isinstance(size, float):
        if not 0 < size <= 1:
            raise ValueError(f"A share of the edges is in (0, 1]; got {size}.")
        size = max(1, round(size * count))
    if not 0 <= size <= count:
        raise ValueError(f"The graph has {count} edges; a circuit of {size} is not among them.")
    order = scores.abs().nan_to_num(-1.0).flatten().argsort(descending=True)[:size]
    kept = torch.zeros(scores.numel(), dtype=torch.bool)
    kept[order.cpu()] = True
    return Circuit(result.upstream, result.downstream, kept.view(scores.shape), scores.cpu(),
                   options={"size": size, "method": result.options.get("method")})  # fmt: skip


@dataclass(repr=False)
class FaithfulnessCurve(Result):
    """How much of the score circuits of growing size recover.

    Attributes:
        sizes: (K,) edges kept; share: (K,) of the graph's edges.
        scores: (K, B) the score with the circuit of each size.
        faithfulness: (K,) (mean score - mean reference score) / (mean model score - mean
            reference score).
        model_score, reference_score: (B,) with every edge kept and with none.
        cpr, cmd: the area under the curve over the share of edges, and between it and 1.
    """

    sizes: Tensor
    share: Tensor
    scores: Tensor
    faithfulness: Tensor
    model_score: Tensor
    reference_score: Tensor
    cpr: float
    cmd: float
    options: dict = field(default_factory=dict)


@analysis_contract
def faithfulness(
    model: nn.Module | HookedModel,
    result: AttributionResult,
    clean: Tensor,
    corrupted: Tensor,
    target: Target = None,
    versus: Target = None,
    sizes: Sequence[int] | None = None,
    progress: bool = True,
) -> FaithfulnessCurve:
    """The faithfulness of the top edges of ``result`` (an `attribution_patching` of these
    images) at each size (default 1, 2, 4, ...; no edge and every edge
    always), each edge outside the circuit reading the ``corrupted`` run's outputs; the score
    is the result's (its classes) unless ``target`` is given."""
    if target is None and result.targets is not None:  # the classes the edges were scored by
        target, versus = result.targets, result.versus
    count = int((~result.edges.mean(0).isnan()).sum())
    chosen = (2**i for i in range(count.bit_length())) if sizes is None else sizes
    sizes = sorted({0, count, *(int(s) for s in chosen if 0 <= int(s) <= count)})
    circuits = [circuit(result, size).edges for size in sizes]
    scores = _circuit_scores(model, clean, corrupted, circuits, target, versus,
                             _by_heads(result), progress)  # fmt: skip
    high, low = scores[-1], scores[0]
    gap = float(high.mean() - low.mean())
    if gap == 0:
        raise ValueError(
            "The corrupted images give the same mean score as the clean ones, so no circuit "
            "can recover anything; choose a corruption that changes the score."
        )
    recovered = (scores.mean(1) - low.mean()) / gap
    share = torch.tensor([s / count for s in sizes], dtype=torch.float64)
    cpr = float(torch.trapezoid(recovered.double(), share))
    cmd = float(torch.trapezoid((1 - recovered.double()).abs(), share))
    return FaithfulnessCurve(
        torch.tensor(list(sizes)), share.float(), scores, recovered, high, low, cpr, cmd,
        options={"method": result.options.get("method"), "edges": count},
    )  # fmt: skip


@analysis_contract
@torch.no_grad()
def _circuit_scores(
    hm: HookedModel, x: Tensor, reference: Tensor, circuits: list[Tensor], target: Target,
    versus: Target, heads: bool, progress: bool = False,
) -> Tensor:  # fmt: skip
    """(K, B) the score of x under each circuit ((U, D) bool edges kept)."""
    runs = CircuitRuns(hm, x, reference, heads)
    score = RunScore.of(runs.clean_output, target, versus)
    rows = torch.arange(len(runs.x), device=runs.x.device)
    circuits = tqdm(circuits, desc="circuits", disable=not progress, leave=False)
    return torch.stack([score(runs.output(kept), rows) for kept in circuits])


def _by_heads(found: Circuit | AttributionResult) -> bool:
    """Whether the graph has a node per head."""
    return any(" head " in name for name in found.upstream)
