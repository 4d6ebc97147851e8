"""Exact patching of a feature circuit's nodes: the effect on the score of patching one latent's
corrupted values into the clean run at the tokens its autoencoder reads, the autoencoder's error
left in place, one edited run each; and of patching each error term, and each whole activation
at those tokens. The first-order effects of `vizkit.circuits.feature_attribution` approximate
these (Marks et al. 2025, "Sparse Feature Circuits", Sec. 2.1 and App. A.1); `feature_agreement`
says how well, as Syed, Rager and Conmy 2023 ("Attribution Patching Outperforms Automated
Circuit Discovery", Sec. 4) measure it for components.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..analysis.component_edits import Edit, RunScore, edited_scores
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_image_pairs
from ..sae.autoencoder import SparseAutoencoder
from ..sae.spliced import replaced_tokens, splice_hook
from .exact import Agreement, agreement_of
from .features import FeatureAttribution, latent_differences

__all__ = ["exact_feature_patching", "feature_agreement"]


@analysis_contract
def exact_feature_patching(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    saes: SparseAutoencoder | Sequence[SparseAutoencoder],
    target: Target = None,
    versus: Target = None,
    latents: Sequence[Sequence[int] | None] | None = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> FeatureAttribution:
    """The patched score less the clean score, patching one latent at a time (per autoencoder
    those of ``latents``, None: all; the others NaN), each error term and each whole activation
    at the autoencoder's tokens. Arguments as `feature_attribution`; one edited copy of the batch
    per patch, ``batch_size`` images per forward (None: as many as 1 GiB holds)."""
    clean, corrupted = check_image_pairs(model.model, clean, corrupted)
    saes = [saes] if isinstance(saes, SparseAutoencoder) else list(saes)
    size = tuple(clean.shape[-2:])
    positions = [replaced_tokens(model, sae, size) for sae in saes]
    chosen = _chosen(saes, latents)
    layers = [sae.source["layer"] for sae in saes]
    with torch.no_grad():
        clean_out, clean_acts = model.run_with_cache(clean, layers)
        corrupted_out, corrupted_acts = model.run_with_cache(corrupted, layers)
    score = RunScore.of(clean_out, target, versus)
    rows = torch.arange(len(clean), device=clean.device)
    edits, wholes = [], []
    for sae, layer, p, indices in zip(saes, layers, positions, chosen, strict=True):
        with torch.no_grad():
            target_latents = sae.encode(corrupted_acts[layer][:, p].float())
        dz, de, da = latent_differences(sae, clean_acts[layer][:, p], corrupted_acts[layer][:, p])
        edits += [Edit(layer, _patch_latent(sae, p, target_latents, i)) for i in indices]
        wholes += [Edit(layer, _add_at(p, de)), Edit(layer, _add_at(p, da))]
    patched = edited_scores(model, clean, edits + wholes, score, batch_size, progress,
                            "exact feature patching")  # fmt: skip
    high = score(clean_out, rows)
    change = (patched - high).T  # (B, runs)
    found, start = [], 0
    for sae, indices in zip(saes, chosen, strict=True):
        effects = change.new_full((len(clean), sae.latents), torch.nan)
        effects[:, indices] = change[:, start : start + len(indices)]
        found.append(effects)
        start += len(indices)
    error, total = change[:, start::2], change[:, start + 1 :: 2]
    return FeatureAttribution(
        layers, found, error, total, high, score(corrupted_out, rows), score.targets,
        score.versus, options={"method": "exact", "batch_size": batch_size},
    )  # fmt: skip


def feature_agreement(
    approximate: FeatureAttribution, exact: FeatureAttribution, k: int = 10
) -> Agreement:
    """How well the latents' effects of ``approximate`` (`feature_attribution`) match those of
    ``exact`` (`exact_feature_patching` of the same images, autoencoders and score), means over
    the images, every autoencoder's latents together (those patched in both)."""
    k = check_count("k", k)
    if approximate.layers != exact.layers or [a.shape for a in approximate.latents] != [
        e.shape for e in exact.latents
    ]:
        raise ValueError(
            "The two results are of different autoencoders; compute both with the same saes."
        )
    a, e = (torch.cat([m.mean(0) for m in r.latents]) for r in (approximate, exact))
    return agreement_of("latents", a, e, k)


def _chosen(
    saes: list[SparseAutoencoder], latents: Sequence[Sequence[int] | None] | None
) -> list[list[int]]:
    """Per autoencoder the latents to patch: ``latents`` checked, None for all."""
    latents = [None] * len(saes) if latents is None else list(latents)
    if len(latents) != len(saes):
        raise ValueError(f"latents gives {len(latents)} lists for {len(saes)} autoencoders.")
    chosen = []
    for sae, indices in zip(saes, latents, strict=True):
        count = sae.latents
        picked = list(range(count)) if indices is None else [int(i) for i in indices]
        if any(not 0 <= i < count for i in picked):
            raise ValueError(f"A latent of an autoencoder of {count} latents is in 0..{count - 1}.")
        chosen.append(picked)
    return chosen


def _patch_latent(
    sae: SparseAutoencoder, positions: Tensor, corrupted: Tensor, latent: int
) -> Callable[[Tensor], Tensor]:
    """The edit of one copy (B, N, C): latent ``latent`` set to its ``corrupted`` values
    (B, T, K) at ``positions``, the error kept."""

    def edit(z: Tensor) -> Tensor:
        z = z.clone()
        z[..., latent] = corrupted[..., latent]
        return z

    hook = splice_hook(sae, positions, edit, keep_error=True)
    return lambda t: hook(t, name="")


def _add_at(positions: Tensor, delta: Tensor) -> Callable[[Tensor], Tensor]:
    """The edit of one copy (B, N, C): ``delta`` (B, T, C) added at ``positions``."""

    def edit(t: Tensor) -> Tensor:
        t = t.clone()
        t[:, positions] += delta.to(t.dtype)
        return t

    return edit
