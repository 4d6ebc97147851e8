"""Exact patching of the component graph: the effect attribution patching approximates, one run
per node and per edge, so that the approximation's quality is a number on the user's model
(Syed, Rager and Conmy 2023, "Attribution Patching Outperforms Automated Circuit Discovery",
Sec. 4: the correlation of attribution and exact effects).

A node is patched where it writes: its corrupted output replaces its clean one in the stream
(a head's output W_O^h z_h split off the attention output as `vizkit.analysis` splits it; for
torch's fused MultiheadAttention, whose maps cannot be edited, its heads' outputs read off its
weights and values through their map to the attention output, `vizkit.head_outputs`). An
edge (u, d) changes only what input d reads: u's difference is added to the stream d reads and
taken away again from what d's branch adds (to an attention input: added to the stream entering
the block and taken from the attention's output; to an MLP input: added to the attention's
output and taken from the MLP's), so every other input reads the clean stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..analysis.component_edits import Edit, RunScore, edited_scores
from ..analysis.residual_stream import (
    block_activations,
    head_outputs,
    residual_blocks,
    split_stream,
)
from ..analysis.result import Result
from ..head_outputs import HeadInputs, multihead_inputs, projection_maps
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_count, check_image_pairs
from .attribution import AttributionResult
from .graph import ComponentGraph
from .points import read_heads

__all__ = ["Agreement", "agreement", "agreement_of", "exact_patching"]


@analysis_contract
def exact_patching(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    target: Target = None,
    versus: Target = None,
    heads: bool = True,
    edges: bool = True,
    batch_size: int | None = None,
    progress: bool = True,
) -> AttributionResult:
    """The effect on the score of patching each node's (and with ``edges``, each edge's)
    corrupted output into the clean run, one run each (U + E runs of the batch, ``batch_size``
    images per forward; None: as many as 1 GiB holds). Arguments as `attribution_patching`;
    the result's ``resid`` is None.
    """
    clean, corrupted = check_image_pairs(model.model, clean, corrupted)
    blocks = residual_blocks(model)
    clean_acts, clean_out = block_activations(model, clean)
    split_stream(clean_acts, blocks)  # refuses a stream that is not one sum of the blocks'
    corrupted_acts, corrupted_out = block_activations(model, corrupted)
    score = RunScore.of(clean_out, target, versus)
    outputs = _node_outputs(model, blocks, heads, (clean, clean_acts), (corrupted, corrupted_acts))
    counts = None if not heads else tuple(len(o) for o in outputs["attn"])
    graph = ComponentGraph(tuple(blocks), counts)
    written = _written(blocks, outputs)  # (hook name, difference) per node, in graph order
    runs = [Edit(name, _add(delta)) for name, delta in written]
    feeds = graph.edges()
    if edges:
        runs += [_edge_edit(blocks, delta, d) for u, (_, delta) in enumerate(written)
                 for d in range(len(graph.downstream)) if feeds[u, d]]  # fmt: skip
    rows = torch.arange(len(clean), device=clean.device)
    patched = edited_scores(model, clean, runs, score, batch_size, progress, "exact patching")
    patched = patched.transpose(0, 1)  # (B, U + E)
    clean_score = score(clean_out, rows)
    change = patched - clean_score[:, None]
    count = len(written)
    edge_effects = change.new_full((len(clean), count, len(graph.downstream)), torch.nan)
    if edges:
        edge_effects[:, feeds] = change[:, count:]
    return AttributionResult(
        graph.upstream, graph.downstream, change[:, :count], edge_effects, None, clean_score,
        score(corrupted_out, rows), score.targets, score.versus,
        options={"method": "exact", "heads": heads, "edges": edges},
        layout=model.token_layout(tuple(clean.shape[-2:])), image_size=tuple(clean.shape[-2:]),
    )  # fmt: skip


def _node_outputs(
    hm: HookedModel, blocks: list[str], heads: bool, *runs: tuple[Tensor, dict[str, Tensor]]
) -> dict[str, list]:
    """Per node kind, the corrupted run's output less the clean run's: "embed" (B, N, C);
    "attn" per block (H, B, N, C) split by head (or (1, B, N, C) whole); "mlp" per block."""
    (clean, clean_acts), (corrupted, corrupted_acts) = runs

    def diff(name: str) -> Tensor:
        return corrupted_acts[name] - clean_acts[name]

    if heads:
        per_head = _head_differences(hm, blocks, *runs)
    else:
        per_head = [diff(f"{b}.hook_attn_out")[None] for b in blocks]
    return {
        "embed": diff(f"{blocks[0]}.hook_resid_pre"),
        "attn": per_head,
        "mlp": [diff(f"{b}.hook_mlp_out") for b in blocks],
    }


def _head_differences(
    hm: HookedModel, blocks: list[str], *runs: tuple[Tensor, dict[str, Tensor]]
) -> list[Tensor]:
    """Per block (H, B, N, C) what each head writes in the corrupted run less the clean one:
    through the `ProjectionMap` of its heads' outputs where the attention is torch's fused
    MultiheadAttention (its maps are read-only), else by editing the maps (`head_outputs`,
    independent of how attribution reads the heads)."""
    fused = multihead_inputs(hm, runs[0][0], blocks)
    split = dict(zip(fused.blocks, _mapped_differences(hm, fused, *runs), strict=True))
    others = [b for b in blocks if b not in split]
    if others:
        split.update(zip(others, _edited_differences(hm, others, *runs), strict=True))
    return [split[b] for b in blocks]


def _mapped_differences(
    hm: HookedModel, found: HeadInputs, *runs: tuple[Tensor, dict[str, Tensor]]
) -> list[Tensor]:
    """Per block of ``found`` (H, B, N, C): each head's change of its heads' outputs z through
    the block's map to its attention output, the map checked on both runs."""
    if not found.blocks:
        return []
    z = [read_heads(hm, x, found) for x, _ in runs]
    attn = [[acts[f"{b}.hook_attn_out"] for b in found.blocks] for _, acts in runs]
    maps = projection_maps(hm, runs[0][0], found, z[0], attn[0])
    differences = []
    for block, made, count, mine, theirs, output in zip(
        found.blocks, maps, found.heads, *z, attn[1], strict=True
    ):
        made.check(block, theirs, output)
        differences.append(made.each_head(theirs - mine, count).permute(2, 0, 1, 3))
    return differences


def _edited_differences(
    hm: HookedModel, blocks: list[str], *runs: tuple[Tensor, dict[str, Tensor]]
) -> list[Tensor]:
    """Per block (H, B, N, C): each head's output, split by editing the maps, corrupted less
    clean."""
    attn = [f"{b}.hook_attn_out" for b in blocks]
    split = [head_outputs(hm, x, blocks, [acts[n] for n in attn]) for x, acts in runs]
    return [(theirs - mine)[:-1] for mine, theirs in zip(*split, strict=True)]


def _written(blocks: list[str], outputs: dict[str, list]) -> list[tuple[str, Tensor]]:
    """(the hook its output is added at, its difference) for each node in graph order."""
    nodes = [(f"{blocks[0]}.hook_resid_pre", outputs["embed"])]
    for block, attn, mlp in zip(blocks, outputs["attn"], outputs["mlp"], strict=True):
        nodes += [(f"{block}.hook_attn_out", head) for head in attn]
        nodes.append((f"{block}.hook_mlp_out", mlp))
    return nodes


def _edge_edit(blocks: list[str], delta: Tensor, downstream: int) -> Edit:
    """The run in which input ``downstream`` (graph order) alone reads ``delta`` more."""
    if downstream == 2 * len(blocks):  # the output: the stream after the last block
        return Edit(f"{blocks[-1]}.hook_resid_post", _add(delta))
    block, branch = blocks[downstream // 2], downstream % 2
    into, out = (("hook_resid_pre", "hook_attn_out"), ("hook_attn_out", "hook_mlp_out"))[branch]
    return Edit(f"{block}.{into}", _add(delta), (Edit(f"{block}.{out}", _subtract(delta)),))


def _add(delta: Tensor) -> Callable[[Tensor], Tensor]:
    return lambda t: t + delta


def _subtract(delta: Tensor) -> Callable[[Tensor], Tensor]:
    return lambda t: t - delta


@dataclass(repr=False)
class Agreement(Result):
    """How well approximate effects match exact ones (means over the images).

    Attributes:
        of: "nodes" or "edges"; count: how many were compared.
        correlation: Pearson's r of the mean effects.
        top_k: the share of the ``k`` largest exact effects (by magnitude) that are also among
            the ``k`` largest approximate ones.
    """

    of: str
    count: int
    correlation: float
    k: int
    top_k: float


def agreement(
    approximate: AttributionResult, exact: AttributionResult, of: str = "edges", k: int = 10
) -> Agreement:
    """The agreement of two results on the same graph (`attribution_patching` and
    `exact_patching` of the same images and score)."""
    check_choice("of", of, ("nodes", "edges"))
    k = check_count("k", k)
    if approximate.upstream != exact.upstream or approximate.downstream != exact.downstream:
        raise ValueError(
            "The two results are of different graphs (one by heads, one by blocks?); compute "
            "both with the same heads= on the same model."
        )
    a, e = (getattr(r, of).mean(0).flatten() for r in (approximate, exact))
    return agreement_of(of, a, e, k)


def agreement_of(of: str, approximate: Tensor, exact: Tensor, k: int) -> Agreement:
    """The `Agreement` of mean effects ``approximate`` and ``exact`` (n,), NaN where one has
    none (left out)."""
    both = ~(approximate.isnan() | exact.isnan())
    a, e = approximate[both].double(), exact[both].double()
    k = min(k, len(e))
    top_a = set(a.abs().topk(k).indices.tolist())
    top_e = set(e.abs().topk(k).indices.tolist())
    r = float(torch.corrcoef(torch.stack([a, e]))[0, 1])
    return Agreement(of, len(e), r, k, len(top_a & top_e) / k)
