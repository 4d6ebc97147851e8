"""Learned attention masks (ELM, GMM; "RetNet Viewed through Convolution", Li and Zhang 2023,
§ 3.1-3.2): read them out of a model, describe them (radial profile, locality, extroversion, the
receptive field they imply) and fit a Gaussian mixture to an element-wise mask (paper Fig. 4). Masks
are (Hm, Np, Np) over the patch block, Hm = 1 for head-shared masks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...analysis.attention_stats import mean_attention_distance
from ...analysis.result import Result
from ...hooks import TokenLayout
from .attention_masks import PAPER_EPS, GaussianMixtureMask, grid_square_distances
from .masked_attention import MaskedAttention

__all__ = [
    "GaussianFit",
    "MaskLocality",
    "fit_gaussian_mixture",
    "gmm_masks_over_training",
    "gmm_parameters",
    "learned_masks",
    "mask_locality",
    "mask_receptive_field",
    "masked_layers",
    "radial_profile",
]


def masked_layers(model: nn.Module) -> dict[str, MaskedAttention]:
    """The model's masked attention layers by module name (``blocks.3.attn``), in order."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, MaskedAttention)}
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no learned attention masks (no ELMAttention or "
            "GMMAttention layer): build one with vizkit.create_model('vizkit_gmm_vit_tiny') or "
            "'vizkit_elm_vit_tiny'."
        )
    return layers


def _grid(model: nn.Module, layer: MaskedAttention, grid: tuple[int, int] | None):
    if grid is not None:
        return tuple(grid)
    if layer.grid_size is not None:
        return tuple(layer.grid_size)
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is None:
        raise ValueError("Cannot tell the patch grid of this model; pass grid=(gh, gw).")
    return tuple(patch_embed.grid_size)


@torch.no_grad()
def learned_masks(model: nn.Module, grid: tuple[int, int] | None = None) -> dict[str, Tensor]:
    """Each masked layer's mask over the patches, ``{"blocks.i.attn": (Hm, Np, Np)}``, on the
    model's grid (or ``grid``: a GMM's mask exists for any grid, an ELM's for its own)."""
    return {
        name: layer.mask(_grid(model, layer, grid)).detach().cpu()
        for name, layer in masked_layers(model).items()
    }


def gmm_parameters(model: nn.Module) -> dict[str, dict[str, Tensor]]:
    """``{"blocks.i.attn": {"alpha": (K, Hm), "sigma": (K, Hm)}}`` of every GMM layer."""
    found = {
        name: {"alpha": layer.mask.alpha.detach().cpu(), "sigma": layer.mask.sigma.detach().cpu()}
        for name, layer in masked_layers(model).items()
        if isinstance(layer.mask, GaussianMixtureMask)
    }
    if not found:
        raise ValueError("The model's masks are element-wise (ELM): it has no alpha or sigma.")
    return found


def _distance_levels(grid: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """The distinct squared distances of a grid (L,) ascending, the level of each of the Np^2
    pairs (Np^2,) and the pair count per level (L,)."""
    d2 = grid_square_distances(grid).round().long().flatten()
    levels, index = torch.unique(d2, return_inverse=True)
    return levels.double(), index, torch.bincount(index, minlength=len(levels)).double()


@torch.no_grad()
def gmm_masks_over_training(
    history: list[dict], grid: tuple[int, int], eps: float = PAPER_EPS
) -> dict[str, dict[int, Tensor]]:
    """The GMM masks of every epoch of a training history recorded with the "masks" tracker:
    ``{"blocks.i.attn": {epoch: (Hm, Np, Np)}}`` (rebuilt from the recorded alpha and sigma)."""
    out: dict[str, dict[int, Tensor]] = {}
    for record in history:
        for layer, p in (record.get("masks") or {}).items():
            if not isinstance(p, dict) or "alpha" not in p:
                raise ValueError(
                    f"Epoch {record.get('epoch')} of the history holds no GMM parameters for "
                    f"{layer} (an ELM model records radial profiles instead)."
                )
            alpha, sigma = torch.tensor(p["alpha"]), torch.tensor(p["sigma"])
            mask = GaussianMixtureMask(alpha.shape[1], alpha.shape[0], eps=eps)
            mask.alpha.data, mask.sigma.data = alpha, sigma
            out.setdefault(layer, {})[record["epoch"]] = mask(grid)
    if not out:
        raise ValueError('The history has no "masks" records: train with track ["masks"].')
    return out


@torch.no_grad()
def radial_profile(mask: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Mean mask value over the patch pairs at each distance: (..., Np, Np) ->
    (distances (D,) in patches, ascending from 0; profile (..., D))."""
    _check_grid(mask, grid)
    levels, index, counts = _distance_levels(grid)
    flat = mask.detach().cpu().flatten(-2).double()
    sums = torch.zeros(*flat.shape[:-1], len(levels), dtype=flat.dtype)
    sums.index_add_(-1, index, flat)
    return levels.sqrt(), (sums / counts).to(mask.dtype)


def _check_grid(mask: Tensor, grid: tuple[int, int]) -> None:
    n = grid[0] * grid[1]
    if mask.shape[-2:] != (n, n):
        raise ValueError(
            f"A mask over a {grid[0]} x {grid[1]} grid is ({n}, {n}) in its last two axes; got "
            f"{tuple(mask.shape)}. Pass the patch block only (no prefix-token rows or columns)."
        )


@dataclass(repr=False)
class MaskLocality(Result):
    """Per head (Hm,): ``correlation`` of mask value with patch distance over the off-diagonal
    pairs (< 0: the mask favours near patches, Fig. 3's locality); ``extroversion``: the mean
    over the distance-1 ring minus the diagonal (> 0: a patch's own score is suppressed
    relative to its neighbours', Fig. 3's "extroversion")."""

    correlation: Tensor
    extroversion: Tensor


@torch.no_grad()
def mask_locality(mask: Tensor, grid: tuple[int, int]) -> MaskLocality:
    """Locality and extroversion of masks (..., Np, Np) on a (gh, gw) grid (Fig. 3)."""
    _check_grid(mask, grid)
    d2 = grid_square_distances(grid, mask.device)
    flat = mask.to(torch.float64).flatten(-2)
    off = (d2 > 0).flatten()
    values, distance = flat[..., off], d2.flatten()[off].sqrt().double()
    values = values - values.mean(-1, keepdim=True)
    distance = distance - distance.mean()
    correlation = (values * distance).sum(-1) / (values.norm(dim=-1) * distance.norm()).clamp_min(
        1e-12
    )
    ring = flat[..., (d2 == 1).flatten()].mean(-1)
    diagonal = mask.to(torch.float64).diagonal(dim1=-2, dim2=-1).mean(-1)
    return MaskLocality(correlation.to(mask.dtype), (ring - diagonal).to(mask.dtype))


@torch.no_grad()
def mask_receptive_field(mask: Tensor, grid: tuple[int, int], logit: float = 1.0) -> Tensor:
    """The receptive field a mask implies on its own: the mean attention distance (in patches)
    of softmax(logit * M), the attention of a masked layer whose scores q.k are all ``logit``
    (content-free): (..., Np, Np) -> (...). A zero mask gives uniform attention and the grid's
    mean pairwise distance (4.14 patches on 8 x 8); local masks give less, extroverted ones
    (self suppressed) at least 1 at high ``logit``."""
    _check_grid(mask, grid)
    attention = (logit * mask.double()).softmax(-1)
    return mean_attention_distance(attention, TokenLayout(0, tuple(grid))).to(mask.dtype)


def _optimise_log_sigma(start: Tensor, error) -> Tensor:
    """L-BFGS on log sigma (K,) from ``start``, minimising ``error(log_sigma)``."""
    log_sigma = start.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([log_sigma], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = error(log_sigma)
        loss.backward()
        return loss

    optimizer.step(closure)
    return log_sigma.detach()


@dataclass(repr=False)
class GaussianFit(Result):
    """A K-Gaussian mixture fitted to a mask: ``alpha`` and ``sigma`` (K,), sorted by sigma;
    ``r2`` the coefficient of determination over all Np^2 entries; ``r2_radial`` the most any
    function of distance alone reaches (the mean mask at each distance); ``fitted`` (Np, Np)."""

    alpha: Tensor
    sigma: Tensor
    r2: float
    r2_radial: float
    fitted: Tensor


def _kernels(d2: Tensor, sigma: Tensor, eps: float) -> Tensor:
    """(L,) squared distances, (K,) sigmas -> (L, K) Gaussians exp(-d^2 / (2 sigma^2 + eps))."""
    return torch.exp(-d2[:, None] / (2 * sigma**2 + eps))


def _best_alpha(design: Tensor, target: Tensor, weight: Tensor) -> Tensor:
    """Weighted least-squares alpha (K,) for design (L, K), target (L,), weight (L,)."""
    gram = design.T @ (weight[:, None] * design)
    ridge = 1e-6 * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)
    return torch.linalg.solve(gram + ridge, design.T @ (weight * target))


def fit_gaussian_mixture(
    mask: Tensor,
    grid: tuple[int, int],
    num_kernels: int = 2,
    eps: float = PAPER_EPS,
    restarts: int = 8,
    seed: int = 0,
) -> GaussianFit:
    """Least-squares fit of sum_k alpha_k exp(-d^2 / (2 sigma_k^2 + eps)) to a mask (Np, Np)
    (paper Fig. 4, which splits a learned ELM into a narrow negative "extroversion" Gaussian
    and a wide local one).

    The model depends on the pair only through d^2, so the squared error over all Np^2
    entries equals a count-weighted fit of the mean mask at each distance (plus the spread
    within distances, which no Gaussian mixture can remove). For fixed sigmas the best alphas
    solve a linear least-squares problem; the sigmas are optimised (L-BFGS on log sigma) from
    ``restarts`` starts (log-spaced, then random), keeping the best, within 0.05 <= sigma <=
    100 x the grid side (beyond, a Gaussian is the identity or a constant); a small ridge keeps
    near-equal sigmas from fitting noise with huge cancelling alphas.
    """
    if mask.ndim != 2:
        raise ValueError(
            f"fit_gaussian_mixture fits one mask (Np, Np); got {tuple(mask.shape)}. Pick a "
            "head, e.g. learned_masks(model)['blocks.0.attn'][0]."
        )
    if num_kernels < 1:
        raise ValueError(f"num_kernels must be >= 1; got {num_kernels}.")
    _check_grid(mask, grid)
    values = mask.detach().double().cpu()
    levels, index, counts = _distance_levels(grid)
    means = radial_profile(values, grid)[1]
    side = max(grid)
    generator = torch.Generator().manual_seed(seed)
    starts = [
        torch.logspace(math.log10(0.2), math.log10(2 * side), num_kernels, dtype=torch.float64)
    ]
    for _ in range(restarts - 1):
        starts.append(
            10 ** (torch.rand(num_kernels, generator=generator, dtype=torch.float64) * 2 - 1)
            * side
            / 2
        )

    bounds = (math.log(0.05), math.log(100 * side))  # beyond them a Gaussian is I or constant

    def error(log_sigma: Tensor) -> Tensor:
        design = _kernels(levels, log_sigma.clamp(*bounds).exp(), eps)
        alpha = _best_alpha(design, means, counts)
        return (counts * (design @ alpha - means) ** 2).sum()

    fits = [_optimise_log_sigma(start.log(), error) for start in starts]
    best = min(fits, key=lambda log_sigma: error(log_sigma).item())
    sigma = best.clamp(*bounds).exp()
    alpha = _best_alpha(_kernels(levels, sigma, eps), means, counts)
    order = sigma.argsort()
    sigma, alpha = sigma[order], alpha[order]
    fitted = (_kernels(levels, sigma, eps) @ alpha)[index].reshape(values.shape)
    total = ((values - values.mean()) ** 2).sum()

    def explained(model: Tensor) -> float:
        return 1 - (((values - model) ** 2).sum() / total).item() if total > 0 else float("nan")

    radial = means[index].reshape(values.shape)
    return GaussianFit(
        alpha.float(), sigma.float(), explained(fitted), explained(radial), fitted.to(mask.dtype)
    )
