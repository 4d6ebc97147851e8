"""Runs of the model with some edges of the component graph reading a
reference run's node outputs in place of this run's (Conmy et al. 2023, "Towards Automated
Circuit Discovery", Sec. 2: the edges outside a circuit patched).

Input d reads the stream; to make it read u's reference output instead of u's output in the
run, the difference (reference - this run's) is added to the stream where d reads it and taken
away again from what d's branch adds (as `vizkit.circuits.exact` patches one edge), so no other
input sees it. u's output in the run is read as the run makes it, so an edge is patched
against what u gives in this run, whichever of u's own inputs are patched.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import Tensor

from ..analysis.residual_stream import residual_blocks
from ..head_outputs import head_inputs, projection_maps
from ..hooks import HookedModel
from ..hooks.inputs import check_images
from .graph import ComponentGraph
from .points import read_points

__all__ = ["CircuitRuns"]


class CircuitRuns:
    """Images x (B, C, H, W) and a reference (B images, one per image, or one for all) for
    runs with edges patched: ``output(kept)`` is the model's output with the edges outside
    ``kept`` ((U, D) bool) reading the reference. With ``heads``, a graph with a node per head:
    what a set of heads writes is read through each block's `ProjectionMap`."""

    def __init__(self, hm: HookedModel, x: Tensor, reference: Tensor, heads: bool = False):
        x, reference = check_images(hm.model, x), check_images(hm.model, reference)
        if len(reference) not in (1, len(x)) or reference.shape[1:] != x.shape[1:]:
            raise ValueError(
                f"reference must be 1 or {len(x)} images (one per image) of the images' shape "
                f"{tuple(x.shape[1:])}; got {tuple(reference.shape)}."
            )
        self.hm, self.x = hm, x
        self.blocks = residual_blocks(hm)
        self.found = head_inputs(hm, x, self.blocks) if heads else None
        self.graph = ComponentGraph(tuple(self.blocks), self.found and self.found.heads)
        clean, self.clean_output = read_points(hm, x, self.blocks, self.found)
        self.reference, _ = read_points(hm, reference, self.blocks, self.found)
        self.maps = None
        if self.found is not None:
            self.maps = projection_maps(hm, x, self.found, clean.z, clean.attn)

    @torch.no_grad()
    def output(self, kept: Tensor) -> object:
        """The model's output on x with every edge of the graph outside ``kept`` patched."""
        feeds = self.graph.edges()
        if kept.shape != feeds.shape:
            raise ValueError(
                f"A circuit of this model has edges {tuple(feeds.shape)}; got {tuple(kept.shape)}."
            )
        patched = feeds & ~kept.cpu()  # (U, D): edges reading the reference
        z: list[Tensor] = []
        reading = nullcontext() if self.found is None else self.found.reading(z.append)
        with reading, self.hm.hooks(fwd=_patching_hooks(self, patched, z)):
            return self.hm.model(self.x)


def _patching_hooks(runs: CircuitRuns, patched: Tensor, z: list[Tensor]) -> dict[str, Callable]:
    """Forward hooks that make each input d read, for every node u with patched[u, d], u's
    reference output in place of its output in the run (heads' outputs: their share of the
    run's heads' outputs ``z``, filled as each block's attention runs)."""
    blocks, reference, graph = runs.blocks, runs.reference, runs.graph
    rows = _node_rows(graph)
    current: dict[int, Tensor] = {}
    stream_reference = {0: reference.resid[0]}
    for layer in range(len(blocks)):
        if runs.maps is None:
            stream_reference[rows["attn"][layer][0]] = reference.attn[layer]
        stream_reference[rows["mlp"][layer]] = reference.mlp[layer]

    def change(d: int) -> Tensor | int:  # what input d reads more: Σ (reference - current)
        total = 0
        for u in patched[:, d].nonzero()[:, 0].tolist():
            if u in stream_reference:
                total = total + stream_reference[u] - current[u]
        if runs.maps is not None:
            for layer, heads in enumerate(rows["attn"]):
                keep = patched[heads, d]
                if bool(keep.any()):
                    total = total + runs.maps[layer].of_heads(reference.z[layer] - z[layer], keep)
        return total

    def at(node: int | None, plus: int | None, minus: int | None) -> Callable:
        def hook(t: Tensor, *, name: str) -> Tensor:
            if node is not None:
                current[node] = t
            out = t if plus is None else t + change(plus)
            return out if minus is None else out - change(minus)

        return hook

    layers = len(blocks)
    fwd = {f"{blocks[0]}.hook_resid_pre": at(0, 0, None)}
    for layer, block in enumerate(blocks):
        attn_in, mlp_in = 2 * layer, 2 * layer + 1
        if layer:
            fwd[f"{block}.hook_resid_pre"] = at(None, attn_in, None)
        attn_node = None if runs.maps is not None else rows["attn"][layer][0]
        fwd[f"{block}.hook_attn_out"] = at(attn_node, mlp_in, attn_in)
        fwd[f"{block}.hook_mlp_out"] = at(rows["mlp"][layer], None, mlp_in)
    fwd[f"{blocks[-1]}.hook_resid_post"] = at(None, 2 * layers, None)
    return fwd


def _node_rows(graph: ComponentGraph) -> dict[str, list]:
    """The upstream rows of each block's attention nodes (its heads, or the one node) and of
    its MLP."""
    rows: dict[str, list] = {"attn": [], "mlp": []}
    row = 1
    for layer in range(len(graph.blocks)):
        count = 1 if graph.heads is None else graph.heads[layer]
        rows["attn"].append(list(range(row, row + count)))
        rows["mlp"].append(row + count)
        row += count + 1
    return rows
