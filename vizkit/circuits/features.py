"""The nodes of a feature circuit (Marks et al. 2025, "Sparse Feature Circuits", Sec. 2): the
latents of the user's sparse autoencoders at their layers, and each autoencoder's error term.

At an autoencoder's layer the activation a of its tokens is decode(z) + e: its latents z
written through the decoder, z W_dec / s (s: the autoencoder's input scale), and the error e.
Patching the corrupted run's latent i into the clean run changes the score, to first order, by
(z_i(corrupted) - z_i(clean)) (W_dec[i] / s) . dM/da summed over the tokens; the error term's
by (e(corrupted) - e(clean)) . dM/da. The latents' effects and the error's add up to the whole
activation's, (a(corrupted) - a(clean)) . dM/da. EAP-IG averages the gradient as in
`vizkit.circuits.attribution`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..analysis.component_edits import RunScore
from ..analysis.residual_stream import require_full_precision, residual_blocks
from ..analysis.result import Result
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count, check_image_pairs
from ..sae.autoencoder import SparseAutoencoder
from ..sae.spliced import replaced_tokens
from .attribution import eap_steps
from .corruptions import warn_if_unchanged

__all__ = ["FeatureAttribution", "feature_attribution"]


@dataclass(repr=False)
class FeatureAttribution(Result):
    """First-order effects of patching each autoencoder latent, and each error term.

    Attributes:
        layers: each autoencoder's layer (hook name).
        latents: per autoencoder (B, K) each latent's effect, summed over its tokens.
        error: (B, S) each autoencoder's error term's effect.
        total: (B, S) the whole activation's effect at each autoencoder's tokens (latents plus
            error).
        clean_score, corrupted_score: (B,); targets, versus: the score's classes, or None.
    """

    layers: list[str]
    latents: list[Tensor]
    error: Tensor
    total: Tensor
    clean_score: Tensor
    corrupted_score: Tensor
    targets: Tensor | None
    versus: Tensor | None
    options: dict = field(default_factory=dict)

    def top(self, autoencoder: int = 0, k: int = 10) -> list[tuple[int, float]]:
        """The ``k`` latents of autoencoder ``autoencoder`` with the largest mean effect by
        magnitude: (latent, mean effect)."""
        mean = self.latents[autoencoder].mean(0)
        order = mean.abs().argsort(descending=True)[: check_count("k", k)]
        return [(int(i), float(mean[i])) for i in order]


@analysis_contract
def feature_attribution(
    model: nn.Module | HookedModel,
    clean: Tensor,
    corrupted: Tensor,
    saes: SparseAutoencoder | Sequence[SparseAutoencoder],
    target: Target = None,
    versus: Target = None,
    method: str = "eap",
    steps: int = 5,
    progress: bool = True,
) -> FeatureAttribution:
    """The effect of each latent of ``saes`` (trained on this model's layers) and of each
    one's error term, from one backward of the clean run (EAP-IG: ``steps``); arguments as
    `vizkit.circuits.attribution_patching`."""
    clean, corrupted = check_image_pairs(model.model, clean, corrupted)
    steps = eap_steps(method, steps)
    require_full_precision(clean, "Feature attribution")
    saes = [saes] if isinstance(saes, SparseAutoencoder) else list(saes)
    size = tuple(clean.shape[-2:])
    positions = [replaced_tokens(model, sae, size) for sae in saes]
    layers = [sae.source["layer"] for sae in saes]
    first = f"{residual_blocks(model)[0]}.hook_resid_pre"
    read = list(dict.fromkeys([first, *layers]))
    with torch.no_grad():
        clean_out, clean_acts = model.run_with_cache(clean, read)
        corrupted_out, corrupted_acts = model.run_with_cache(corrupted, read)
    score = RunScore.of(clean_out, target, versus)
    rows = torch.arange(len(clean), device=clean.device)
    high, low = score(clean_out, rows), score(corrupted_out, rows)
    warn_if_unchanged(clean_out, score, high, low)
    differences = [latent_differences(sae, clean_acts[n][:, p], corrupted_acts[n][:, p])
                   for sae, n, p in zip(saes, layers, positions, strict=True)]  # fmt: skip
    start, end = corrupted_acts[first], clean_acts[first]
    sums = None
    for k in tqdm(range(1, steps + 1), desc=method, disable=not progress or steps == 1,
                  leave=False):  # fmt: skip
        gradients = _gradients(model, clean, start + (end - start) * (k / steps), first, layers,
                               lambda out: score(out, rows))  # fmt: skip
        parts = zip(saes, gradients, positions, differences, strict=True)
        effects = [latent_effects(sae, g[:, p], d) for sae, g, p, d in parts]
        sums = (
            effects
            if sums is None
            else [
                [a + b for a, b in zip(s, e, strict=True)]
                for s, e in zip(sums, effects, strict=True)
            ]
        )
    latents, error, total = ([part / steps for part in parts] for parts in zip(*sums, strict=True))
    return FeatureAttribution(
        layers, latents, torch.stack(error, 1), torch.stack(total, 1), high, low,
        score.targets, score.versus, options={"method": method, "steps": steps},
    )  # fmt: skip


def latent_differences(
    sae: SparseAutoencoder, clean: Tensor, corrupted: Tensor
) -> tuple[Tensor, ...]:
    """(latents' difference (B, T, K), error's difference (B, T, C), activation's difference)
    of the tokens (B, T, C) of the clean and corrupted runs at the autoencoder's layer."""
    with torch.no_grad():
        parts = []
        for tokens in (clean, corrupted):
            z = sae.encode(tokens.float())
            parts.append((z, tokens.float() - sae.decode(z)))
    (z_clean, e_clean), (z_corrupted, e_corrupted) = parts
    return z_corrupted - z_clean, e_corrupted - e_clean, (corrupted - clean).float()


@torch.no_grad()
def latent_effects(
    sae: SparseAutoencoder, gradient: Tensor, difference: tuple[Tensor, ...]
) -> list:
    """[latents (B, K), error (B,), total (B,)]: the differences times the gradient (B, T, C)
    at the tokens, a latent's written through its decoder row."""
    dz, de, da = difference
    gradient = gradient.float()
    through = gradient @ sae.W_dec.T / sae.input_scale  # (B, T, K): dM/dz
    return [(dz * through).sum(1), (de * gradient).sum((1, 2)), (da * gradient).sum((1, 2))]


def _gradients(
    hm: HookedModel, x: Tensor, embedded: Tensor, first: str, layers: list[str], score
) -> list[Tensor]:
    """The gradient of ``score`` at each of ``layers`` (B, N, C), on a run of x with the stream
    entering the first block (``first``) set to ``embedded``."""
    with torch.enable_grad(), frozen_parameters(hm.model):
        value, kept = traced_run(hm, x, embedded, first, layers, score)
        return list(torch.autograd.grad(value.sum(), [kept[n] for n in layers]))


def traced_run(
    hm: HookedModel, x: Tensor, embedded: Tensor, first: str, layers: list[str], score
) -> tuple[Tensor, dict[str, Tensor]]:
    """The score (B,) of a run of x with the stream entering the first block (``first``) set to
    ``embedded`` (B, N, C), and the activations at ``layers`` (B, N, C) the run went on with,
    recorded by autograd from ``embedded`` on (call with grad enabled)."""
    leaf = embedded.detach().clone().requires_grad_(True)
    kept: dict[str, Tensor] = {}

    def keep(t: Tensor, *, name: str) -> Tensor:
        kept[name] = leaf if name == first else t.view_as(t)
        return kept[name]

    with hm.hooks(fwd=dict.fromkeys(dict.fromkeys([first, *layers]), keep)):
        value = score(hm.model(x))
    return value, kept
