"""The edges of a feature circuit between the nodes of consecutive sparse autoencoders (Marks
et al. 2025, "Sparse Feature Circuits", Sec. 2.2 and App. A.1, Eq. 5): from an upstream node u
(a latent or the error term) to a downstream node d, (dM/dd) (dd/du) (u(corrupted) - u(clean)),
the model's computation between the two layers as it is and dM/dd, the downstream node's
gradient, held fixed. Nodes are summed over the tokens their autoencoder reads, as
`vizkit.circuits.feature_attribution` sums them.

One vector-Jacobian product per downstream node: dM/dd times d's value, pulled back from the
downstream layer to the upstream activation (B, N, C), gives each upstream latent's edge
through its decoder row and the error's through its difference. Only the ``k`` downstream
latents with the largest mean node effect by magnitude, and the error term, get one. Summed over
the upstream latents and error, a downstream node's edges are the whole upstream activation's
difference times the same product (the latents and error add up to the activation). The edges
from the last autoencoder's nodes to the score are their node effects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.component_edits import RunScore
from ..analysis.residual_stream import residual_blocks
from ..analysis.result import Result
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count, check_image_pairs
from ..sae.autoencoder import SparseAutoencoder
from ..sae.spliced import replaced_tokens
from .features import (
    FeatureAttribution,
    feature_attribution,
    latent_differences,
    latent_effects,
    traced_run,
)

__all__ = ["FeatureEdges", "feature_edges"]


@dataclass(repr=False)
class FeatureEdges(Result):
    """First-order edge effects between the nodes of consecutive autoencoders.

    Attributes:
        layers: the autoencoders' layers, in the order the model runs them.
        kept: per consecutive pair, (k,) the downstream latents given edges.
        edges: per pair (B, K_up + 1, k + 1): from each upstream latent (the error last) to each
            kept downstream latent (the error last).
        whole: per pair (B, k + 1): the whole upstream activation's difference through each
            downstream node (the sum of its edges).
        nodes: the node effects (`feature_attribution`); the last autoencoder's are its edges to
            the score.
    """

    layers: list[str]
    kept: list[Tensor]
    edges: list[Tensor]
    whole: list[Tensor]
    nodes: FeatureAttribution
    options: dict = field(default_factory=dict)


@analysis_contract
def feature_edges(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    saes: Sequence[SparseAutoencoder],
    target: Target = None,
    versus: Target = None,
    k: int = 10,
    method: str = "eap",
    steps: int = 5,
    progress: bool = True,
) -> FeatureEdges:
    """The edges between the nodes of each pair of consecutive autoencoders of ``saes`` (two or
    more, at different layers of this model, sorted into the order the model runs them); the
    ``k`` downstream latents of largest mean node effect get edges. Arguments as
    `feature_attribution`.

    Cost per step (EAP: 1, EAP-IG: ``steps``): the node effects' forward and backward, one more
    forward, one backward to the layers and k + 1 vector-Jacobian products per pair.
    """
    k = check_count("k", k)
    clean, corrupted = check_image_pairs(model.model, clean, corrupted)
    size = tuple(clean.shape[-2:])
    saes = run_order(model, list(saes), size, clean[:1])
    nodes = feature_attribution(model, clean, corrupted, saes, target, versus, method, steps,
                                progress)  # fmt: skip
    steps, layers = nodes.options["steps"], nodes.layers
    positions = [replaced_tokens(model, sae, size) for sae in saes]
    first = f"{residual_blocks(model)[0]}.hook_resid_pre"
    read = list(dict.fromkeys([first, *layers]))
    with torch.no_grad():
        clean_out, clean_acts = model.run_with_cache(clean, read)
        _, corrupted_acts = model.run_with_cache(corrupted, read)
    score = RunScore.of(clean_out, target, versus)
    rows = torch.arange(len(clean), device=clean.device)
    differences = [latent_differences(sae, clean_acts[n][:, p], corrupted_acts[n][:, p])
                   for sae, n, p in zip(saes, layers, positions, strict=True)]  # fmt: skip
    kept = [m.mean(0).abs().argsort(descending=True)[:k] for m in nodes.latents[1:]]
    start, end = corrupted_acts[first], clean_acts[first]
    sums = None
    for step in tqdm(range(1, steps + 1), desc=f"{method} edges", disable=not progress,
                     leave=False):  # fmt: skip
        with torch.enable_grad(), frozen_parameters(model.model):
            value, acts = traced_run(model, clean, start + (end - start) * (step / steps), first,
                                     layers, lambda out: score(out, rows))  # fmt: skip
            gradients = torch.autograd.grad(value.sum(), [acts[n] for n in layers[1:]],
                                            retain_graph=True)  # fmt: skip
            found = [_pair_edges(saes[i], saes[i + 1], acts[layers[i]], acts[layers[i + 1]],
                                 gradients[i], positions[i], positions[i + 1], differences[i],
                                 kept[i]) for i in range(len(saes) - 1)]  # fmt: skip
        sums = (
            found
            if sums is None
            else [(e + f, w + v) for (e, w), (f, v) in zip(sums, found, strict=True)]
        )
    return FeatureEdges(
        layers, [c.cpu() for c in kept], [e / steps for e, _ in sums], [w / steps for _, w in sums],
        nodes, options={"method": method, "steps": steps, "k": k},
    )  # fmt: skip


def run_order(
    hm: HookedModel, saes: list[SparseAutoencoder], size: tuple[int, int], x: Tensor
) -> list[SparseAutoencoder]:
    """``saes`` (checked to be of this model on images of ``size``) in the order their layers
    run in a forward of x (one image). Refuses fewer than two, two at one layer, and a layer
    that runs more than once (its depth is not one place)."""
    if len(saes) < 2 or not all(isinstance(s, SparseAutoencoder) for s in saes):
        raise ValueError(
            "Edges join the nodes of two or more sparse autoencoders at different layers; "
            "for one autoencoder's nodes use vk.circuits.feature_attribution."
        )
    for sae in saes:
        replaced_tokens(hm, sae, size)  # refuses an autoencoder of another model
    layers = [sae.source["layer"] for sae in saes]
    shared = sorted({n for n in layers if layers.count(n) > 1})
    if shared:
        raise ValueError(
            f"Two autoencoders read {shared[0]}; edges join autoencoders at different layers, "
            "so pass one autoencoder per layer."
        )
    fired: list[str] = []

    def note(t: Tensor, *, name: str) -> None:
        fired.append(name)

    with torch.no_grad(), hm.hooks(fwd=dict.fromkeys(layers, note), read_only=True):
        hm.model(x)
    again = sorted({n for n in fired if fired.count(n) > 1})
    if again:
        raise ValueError(
            f"{again[0]} runs more than once in a forward, so it has no one depth to order its "
            "autoencoder by; choose autoencoders at layers that run once."
        )
    return sorted(saes, key=lambda sae: fired.index(sae.source["layer"]))


def _pair_edges(
    up: SparseAutoencoder, down: SparseAutoencoder, upstream: Tensor, downstream: Tensor,
    gradient: Tensor, up_tokens: Tensor, down_tokens: Tensor, difference: tuple[Tensor, ...],
    kept: Tensor,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """edges (B, K_up + 1, k + 1) and whole (B, k + 1) from the activations ``upstream`` and
    ``downstream`` (B, N, C) of one recorded run, ``gradient`` (B, N, C) the score's at the
    downstream one and ``difference`` the upstream tokens' (`latent_differences`)."""
    tokens = downstream[:, down_tokens]
    latents = down.encode(tokens)
    error = tokens.float() - down.decode(latents)
    held = gradient[:, down_tokens].detach().float()
    with torch.no_grad():
        through = held @ down.W_dec.T / down.input_scale  # (B, T, K): dM/dz, held fixed
    values = [(through[..., j] * latents[..., j]).sum() for j in kept.tolist()]
    values.append((held * error).sum())
    columns = []
    for value in values:
        (pulled,) = torch.autograd.grad(value, upstream, retain_graph=True, allow_unused=True)
        pulled = torch.zeros_like(upstream) if pulled is None else pulled
        columns.append(latent_effects(up, pulled[:, up_tokens], difference))
    edges = torch.stack([torch.cat([z, e[:, None]], 1) for z, e, _ in columns], -1)
    return edges, torch.stack([whole for *_, whole in columns], -1)
