"""A feature circuit and its faithfulness (Marks et al. 2025, "Sparse Feature Circuits",
Sec. 3, Eq. 4): the latents of largest mean node effect by magnitude across the autoencoders,
and how much of the score the model keeps with every other latent patched.

A run of a circuit: at each autoencoder's layer, in the order the model runs them, the latents
of its tokens are encoded from this run's activation; those outside the circuit take their
value on a reference run (the corrupted image's, or the mean over the corrupted images), and
the activation is rewritten with the change (`vizkit.sae.splice_hook`). The error terms are in
the circuit by default, as Marks et al. keep them (left as this run computes them); with
``errors=False`` they take the reference run's value too. Faithfulness:
(M(C) - M(none)) / (M(model) - M(none)), scores averaged over the images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..analysis.component_edits import Edit, RunScore, edited_scores
from ..analysis.result import Result
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_image_pairs
from ..sae.autoencoder import SparseAutoencoder
from ..sae.spliced import replaced_tokens, splice_hook
from .circuit import FaithfulnessCurve
from .features import FeatureAttribution

__all__ = ["FeatureCircuit", "feature_circuit", "feature_faithfulness"]

REFERENCES = ("corrupted", "mean")


@dataclass(repr=False)
class FeatureCircuit(Result):
    """The latents kept of a feature circuit.

    Attributes:
        layers: each autoencoder's layer.
        latents: per autoencoder (K,) bool, the latents in the circuit.
        scores: per autoencoder (K,) the mean effects they were chosen by.
        errors: whether the error terms are in the circuit.
    """

    layers: list[str]
    latents: list[Tensor]
    scores: list[Tensor]
    errors: bool
    options: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(int(kept.sum()) for kept in self.latents)

    def run(
        self, model: nn.Module | HookedModel, clean: Tensor, corrupted: Tensor,
        saes: Sequence[SparseAutoencoder], target: Target = None, versus: Target = None,
        reference: str = "corrupted",
    ) -> Tensor:  # fmt: skip
        """(B,) the score on ``clean`` with every latent outside the circuit at ``reference``'s
        value ("corrupted": the image's pair; "mean": the mean over ``corrupted``)."""
        return _circuit_scores(model, clean, corrupted, saes, [self.latents], self.errors,
                               reference, target, versus, self.layers)[0]  # fmt: skip


def feature_circuit(
    result: FeatureAttribution, size: int | float, errors: bool = True
) -> FeatureCircuit:
    """The circuit of the ``size`` latents (an int) or share of latents (a float in (0, 1]) of
    largest mean effect by magnitude in ``result``, across its autoencoders; ``errors``: the
    error terms in the circuit."""
    means = [m.mean(0).cpu() for m in result.latents]
    scores = torch.cat(means)
    count = len(scores)
    if isinstance(size, float):
        if not 0 < size <= 1:
            raise ValueError(f"A share of the latents is in (0, 1]; got {size}.")
        size = max(1, round(size * count))
    if not 0 <= size <= count:
        raise ValueError(
            f"The autoencoders have {count} latents; a circuit of {size} is not among them."
        )
    kept = torch.zeros(count, dtype=torch.bool)
    kept[scores.abs().nan_to_num(-1.0).argsort(descending=True)[:size]] = True
    return FeatureCircuit(
        list(result.layers), list(kept.split([len(m) for m in means])), means, bool(errors),
        options={"size": size, "method": result.options.get("method")},
    )  # fmt: skip


@analysis_contract
def feature_faithfulness(
    model: nn.Module | HookedModel,
    result: FeatureAttribution,
    clean: Tensor,
    corrupted: Tensor,
    saes: Sequence[SparseAutoencoder],
    target: Target = None,
    versus: Target = None,
    sizes: Sequence[int] | None = None,
    errors: bool = True,
    reference: str = "corrupted",
    batch_size: int | None = None,
    progress: bool = True,
) -> FaithfulnessCurve:
    """The faithfulness of the top latents of ``result`` (a `feature_attribution` of these
    images and ``saes``) at each size (default 1, 2, 4, ...; none and all always), every other
    latent at ``reference``'s value; the score is the result's unless ``target`` is given. One
    edited copy of the batch per size, ``batch_size`` images per forward (None: as many as
    1 GiB holds)."""
    if target is None and result.targets is not None:
        target, versus = result.targets, result.versus
    count = sum(m.shape[1] for m in result.latents)
    chosen = (2**i for i in range(count.bit_length())) if sizes is None else sizes
    sizes = sorted({0, count, *(int(s) for s in chosen if 0 <= int(s) <= count)})
    circuits = [feature_circuit(result, size, errors).latents for size in sizes]
    scores = _circuit_scores(model, clean, corrupted, saes, circuits, errors, reference, target,
                             versus, result.layers, batch_size, progress)  # fmt: skip
    with torch.no_grad():
        output = model.model(clean)
    rows = torch.arange(len(clean), device=clean.device)
    high, low = RunScore.of(output, target, versus)(output, rows), scores[0]
    gap = float(high.mean() - low.mean())
    if gap == 0:
        raise ValueError(
            "The circuit of no latent gives the model's mean score, so no circuit can recover "
            "anything; choose a corruption that changes the score."
        )
    recovered = (scores.mean(1) - low.mean()) / gap
    share = torch.tensor([s / count for s in sizes], dtype=torch.float64)
    cpr = float(torch.trapezoid(recovered.double(), share))
    cmd = float(torch.trapezoid((1 - recovered.double()).abs(), share))
    return FaithfulnessCurve(
        torch.tensor(sizes), share.float(), scores, recovered, high, low, cpr, cmd,
        options={"method": result.options.get("method"), "latents": count, "errors": errors,
                 "reference": reference},
    )  # fmt: skip


@analysis_contract
@torch.no_grad()
def _circuit_scores(
    hm: HookedModel, clean: Tensor, corrupted: Tensor, saes: Sequence[SparseAutoencoder],
    circuits: list[list[Tensor]], errors: bool, reference: str, target: Target,
    versus: Target, layers: list[str], batch_size: int | None = None, progress: bool = False,
) -> Tensor:  # fmt: skip
    """(len(circuits), B) the score of ``clean`` under each circuit (per autoencoder (K,) bool
    latents kept), one edited copy of the batch each."""
    clean, corrupted = check_image_pairs(hm.model, clean, corrupted)
    check_choice("reference", reference, REFERENCES)
    saes = list(saes)
    if [sae.source.get("layer") for sae in saes] != list(layers):
        raise ValueError(
            f"The circuit is of autoencoders at {layers}; pass those autoencoders, in that order."
        )
    positions = [replaced_tokens(hm, sae, tuple(clean.shape[-2:])) for sae in saes]
    output, acts = hm.run_with_cache(corrupted, layers)
    references = []
    for sae, layer, p in zip(saes, layers, positions, strict=True):
        tokens = acts[layer][:, p].float()
        z, e = sae.encode(tokens), tokens - sae.decode(sae.encode(tokens))
        if reference == "mean":
            z, e = (v.mean(0, keepdim=True).expand_as(v) for v in (z, e))
        references.append((z, None if errors else e))
    edits = []
    for kept in circuits:
        ablations = _ablations(saes, positions, kept, references)
        first, *rest = (Edit(n, f) for n, f in zip(layers, ablations, strict=True))
        edits.append(Edit(first.name, first.fn, tuple(rest)))
    score = RunScore.of(hm.model(clean), target, versus)
    return edited_scores(hm, clean, edits, score, batch_size, progress, "feature circuits")


def _ablations(
    saes: list[SparseAutoencoder], positions: list[Tensor], kept: list[Tensor],
    references: list[tuple[Tensor, Tensor | None]],
) -> list[Callable[[Tensor], Tensor]]:  # fmt: skip
    """Per autoencoder the edit of one copy (B, N, C): the latents outside ``kept`` at the
    reference's values (B, T, K); the error at the reference's (B, T, C) where it is given."""
    return [_ablation(sae, p, k, z, e) for sae, p, k, (z, e) in
            zip(saes, positions, kept, references, strict=True)]  # fmt: skip


def _ablation(
    sae: SparseAutoencoder, positions: Tensor, kept: Tensor, latents: Tensor, error: Tensor | None
) -> Callable[[Tensor], Tensor]:
    kept = kept.to(latents.device)
    hook = splice_hook(sae, positions, lambda z: torch.where(kept, z, latents),
                       keep_error=error is None)  # fmt: skip
    if error is None:
        return lambda t: hook(t, name="")

    def with_error(t: Tensor) -> Tensor:
        t = hook(t, name="")
        t[:, positions] += error.to(t.dtype)
        return t

    return with_error
