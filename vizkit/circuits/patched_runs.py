"""Runs of the model with some edges of the component graph (of whole blocks) reading a
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

import torch
from torch import Tensor

from ..analysis.residual_stream import block_activations, residual_blocks
from ..hooks import HookedModel
from ..hooks.inputs import check_images
from .graph import ComponentGraph

__all__ = ["CircuitRuns"]


class CircuitRuns:
    """Images x (B, C, H, W) and a reference (B images, one per image, or one for all) for
    runs with edges patched: ``output(kept)`` is the model's output with the edges outside
    ``kept`` ((U, D) bool) reading the reference."""

    def __init__(self, hm: HookedModel, x: Tensor, reference: Tensor) -> None:
        x, reference = check_images(hm.model, x), check_images(hm.model, reference)
        if len(reference) not in (1, len(x)) or reference.shape[1:] != x.shape[1:]:
            raise ValueError(
                f"reference must be 1 or {len(x)} images (one per image) of the images' shape "
                f"{tuple(x.shape[1:])}; got {tuple(reference.shape)}."
            )
        self.hm, self.x = hm, x
        self.blocks = residual_blocks(hm)
        self.graph = ComponentGraph(tuple(self.blocks))
        self.outputs = node_hooks(self.blocks)
        _, self.clean_output = block_activations(hm, x)
        reference_acts, _ = block_activations(hm, reference)
        self.reference = [reference_acts[n] for n in self.outputs]

    @torch.no_grad()
    def output(self, kept: Tensor) -> object:
        """The model's output on x with every edge of the graph outside ``kept`` patched."""
        feeds = self.graph.edges()
        if kept.shape != feeds.shape:
            raise ValueError(
                f"A circuit of this model has edges {tuple(feeds.shape)}; got {tuple(kept.shape)}."
            )
        patched = (feeds & ~kept.cpu()).to(self.x.device)  # (U, D): edges reading the reference
        with self.hm.hooks(fwd=_patching_hooks(self.blocks, self.outputs, self.reference, patched)):
            return self.hm.model(self.x)


def node_hooks(blocks: list[str]) -> list[str]:
    """The hook each node of a graph of whole blocks writes at, in graph order."""
    names = [f"{blocks[0]}.hook_resid_pre"]
    for b in blocks:
        names += [f"{b}.hook_attn_out", f"{b}.hook_mlp_out"]
    return names


def _patching_hooks(
    blocks: list[str], outputs: list[str], reference: list[Tensor], patched: Tensor
) -> dict[str, Callable]:
    """Forward hooks that make each input d read, for every node u with patched[u, d], u's
    ``reference`` output in place of its output in the run."""
    current: dict[int, Tensor] = {}

    def change(d: int) -> Tensor | int:  # what input d reads more: Σ (reference - current)
        terms = [reference[u] - current[u] for u in patched[:, d].nonzero()[:, 0].tolist()]
        return sum(terms) if terms else 0

    def at(node: int | None, plus: int | None, minus: int | None) -> Callable:
        def hook(t: Tensor, *, name: str) -> Tensor:
            if node is not None:
                current[node] = t
            out = t if plus is None else t + change(plus)
            return out if minus is None else out - change(minus)

        return hook

    layers = len(blocks)
    fwd = {outputs[0]: at(0, 0, None)}
    for layer, block in enumerate(blocks):
        attn_in, mlp_in = 2 * layer, 2 * layer + 1
        if layer:
            fwd[f"{block}.hook_resid_pre"] = at(None, attn_in, None)
        fwd[outputs[2 * layer + 1]] = at(2 * layer + 1, mlp_in, attn_in)
        fwd[outputs[2 * layer + 2]] = at(2 * layer + 2, None, mlp_in)
    fwd[f"{blocks[-1]}.hook_resid_post"] = at(None, 2 * layers, None)
    return fwd
