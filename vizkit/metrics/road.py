"""ROAD, RemOve And Debias (Rong et al., ICML 2022, "A Consistent and Efficient Evaluation
Strategy for Attribution Methods", Sec. 4): pixels are removed by their saliency, most relevant
first (MoRF: a faithful map makes the score fall fast) or least relevant first (LeRF: it should
stay), and filled by noisy linear imputation rather than a constant, so that the removal's shape
does not leak the class. Each removed pixel is the weighted mean of its 8 neighbours (direct 1/6,
diagonal 1/12), solved jointly for all removed pixels (a sparse positive-definite system, by
conjugate gradients on the device, every image and channel at once), plus Gaussian noise."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult, rank_descending, saliency_maps
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_choice, check_count, check_images, check_number
from .faithfulness import CurveResult, CurveScoring, batch_images, scored_classes
from .registry import ScoredBatch, metric

__all__ = ["ORDERS", "noisy_linear_imputation", "road"]

ORDERS = ("morf", "lerf")
DIAGONAL = 1 / 12  # a diagonal neighbour's weight; a direct one's is 1 / 6
BLOCK_VALUES = 2**17  # on a CPU, planes solved together: 1 MiB of float64 stays in cache


def _neighbour_sum(values: Tensor) -> Tensor:
    """(P, H, W): each pixel's weighted sum of its 8 neighbours (none beyond the border). The
    weights are (1 2 1)^T (1 2 1) / 12 less the centre's 4 / 12: two 1-D passes in place (a
    3 x 3 convolution or eight shifted slices run 2x to 15x slower in float64 on a CPU)."""
    p = F.pad(values, (1, 1, 1, 1))
    rows = torch.add(p[:, :, :-2], p[:, :, 2:]).add_(p[:, :, 1:-1], alpha=2)
    both = torch.add(rows[:, :-2], rows[:, 2:]).add_(rows[:, 1:-1], alpha=2)
    return both.add_(values, alpha=-4).mul_(DIAGONAL)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """(P,): the planes' inner products."""
    return torch.linalg.vecdot(a.flatten(1), b.flatten(1))


def _harmonic_fill(values: Tensor, unknown: Tensor, tolerance: float, max_iterations: int):
    """Planes ``values`` (P, H, W) float64 with the ``unknown`` (P, H, W) 0/1 pixels solved by
    conjugate gradients: each the weighted mean of its neighbours, known or solved."""
    weight = _neighbour_sum(torch.ones_like(values[:1]))  # sum of the valid neighbours' weights
    known = 1 - unknown
    rhs = _neighbour_sum(values * known).mul_(unknown)  # the known neighbours
    solution = torch.zeros_like(values)
    residual = rhs.clone()
    direction = rhs.clone()  # zero off the unknowns, as every residual
    norm = _dot(residual, residual)
    limit = tolerance**2 * norm
    for _ in range(max_iterations):
        if bool((norm <= limit).all()):
            break
        product = _neighbour_sum(direction).sub_(weight * direction).mul_(unknown)  # -M d
        step = (norm / _dot(direction, product).neg_().clamp_min(1e-300)).view(-1, 1, 1)
        solution.addcmul_(step, direction)
        residual.addcmul_(step, product)
        new_norm = _dot(residual, residual)
        direction.mul_((new_norm / norm.clamp_min(1e-300)).view(-1, 1, 1)).add_(residual)
        norm = new_norm
    else:
        raise ValueError(f"The imputation did not converge in {max_iterations} iterations.")
    return values * known + solution * unknown


def noisy_linear_imputation(
    x: Tensor, removed: Tensor, noise: float = 0.01, generator: torch.Generator | None = None,
    tolerance: float = 1e-6, max_iterations: int = 2000,
) -> Tensor:  # fmt: skip
    """Images x (N, C, H, W) with the pixels ``removed`` (N, H, W) bool replaced: each is the
    neighbour-weighted mean of its neighbours, known or imputed (the harmonic fill of the
    removed region), plus ``noise`` times a standard normal (from ``generator``). Every image
    and channel is solved at once on a GPU, in cache-sized blocks on a CPU.

    Raises:
        ValueError: an image with every pixel removed (nothing to impute from), or conjugate
            gradients that do not reach ``tolerance`` (relative residual) in ``max_iterations``.
    """
    everything = removed.flatten(1).all(1)
    if bool(everything.any()):
        raise ValueError("ROAD cannot impute an image whose every pixel is removed.")
    n, c, h, w = x.shape
    unknown = removed[:, None].to(torch.float64).expand(n, c, h, w).reshape(n * c, h, w)
    values = x.to(torch.float64).reshape(n * c, h, w)
    block = len(values) if x.device.type != "cpu" else max(1, BLOCK_VALUES // (h * w))
    filled = torch.cat([
        _harmonic_fill(values[i : i + block], unknown[i : i + block], tolerance, max_iterations)
        for i in range(0, len(values), block)
    ])  # fmt: skip
    if noise:
        draw = torch.randn(filled.shape, generator=generator, dtype=torch.float64)
        filled = filled + noise * draw.to(filled.device) * unknown
    return filled.reshape(n, c, h, w).to(x.dtype)


@analysis_contract
def road(
    model: nn.Module | HookedModel, x: Tensor, saliency: SaliencyResult | Tensor,
    target: Target = None, order: str = "morf",
    fractions: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    noise: float = 0.01, seed: int = 0, batch_size: int | None = None,
) -> CurveResult:  # fmt: skip
    """The ROAD curve per image: the target's probability (or score, for a score target) with
    each of ``fractions`` of the pixels removed, most (``order="morf"``) or least (``"lerf"``)
    salient first, and imputed.

    Args:
        saliency: a `SaliencyResult` or maps (B, h, w) tiling the images, upsampled to pixels
            (bilinear); constant maps are refused.
        target: the class scored (int, B ints, or None: the maps' classes, else the
            prediction), or a score target (`vizkit.targets`; a backbone's embedding score)
            whose value the curve tracks.
        fractions: shares of the pixels removed, each in (0, 1), increasing.
        noise: the imputation noise's standard deviation (the paper's 0.01 on [0, 1] images);
            seed: its generator; batch_size: images per forward (None: 2**19 pixels).

    Returns:
        `CurveResult` of kind "road_morf" or "road_lerf": ``scores`` (B, S) at ``fractions``,
        ``auc`` the trapezoid area over them (MoRF: lower is better; LeRF: higher).
    """
    x = check_images(model.model, x)
    check_choice("order", order, ORDERS)
    noise = check_number("noise", noise, 0)
    seed = check_count("seed", seed, 0)
    shares = torch.tensor([check_number("fractions", f, 0, 1, low_open=True, high_open=True)
                           for f in fractions], dtype=torch.float64)  # fmt: skip
    if not len(shares) or bool((shares.diff() <= 0).any()):
        raise ValueError(f"fractions must be increasing shares in (0, 1); got {fractions}.")
    image_size = tuple(x.shape[-2:])
    maps = saliency_maps(saliency, len(x), image_size).float().to(x.device)
    if tuple(maps.shape[-2:]) != image_size:
        maps = F.interpolate(maps[:, None], size=image_size, mode="bilinear")[:, 0]
    pixels = maps[0].numel()
    rank = rank_descending(maps.flatten(1) if order == "morf" else -maps.flatten(1))
    counts = (shares * pixels).round().long().clamp(1, pixels - 1)
    generator = torch.Generator().manual_seed(seed)
    chunk = batch_images(batch_size, x, model.model)
    scoring = CurveScoring.of(target)
    with torch.no_grad():
        every = torch.arange(len(x), device=x.device)
        targets = scored_classes(scoring.read(model(x), every), target, saliency, scores=True)
        pairs = [(b, k) for k in range(len(counts)) for b in range(len(x))]  # alike in a block
        scores = torch.empty(len(x), len(counts), device=x.device)
        for start in range(0, len(pairs), chunk):
            b = torch.tensor([p[0] for p in pairs[start : start + chunk]], device=x.device)
            k = torch.tensor([p[1] for p in pairs[start : start + chunk]])
            removed = (rank[b] < counts[k].to(x.device)[:, None]).view(-1, *image_size)
            imputed = noisy_linear_imputation(x[b], removed, noise, generator)
            values = scoring.values(scoring.read(model(imputed), b))
            scores[b, k.to(x.device)] = values.gather(1, targets[b][:, None])[:, 0]
    fractions_removed = (counts.double() / pixels).float().to(x.device)
    return CurveResult(
        kind=f"road_{order}", fractions=fractions_removed, scores=scores,
        auc=torch.trapezoid(scores, fractions_removed, dim=-1),
        targets=None if scoring.score is not None else targets,
        options={"order": order, "noise": noise, "seed": seed}, layout=model.token_layout(
            image_size), image_size=image_size,
    )  # fmt: skip


@metric("road_morf_auc", higher=False, perturbs=True,
        summary="area under ROAD, top pixels imputed first (Rong et al. 2022)")  # fmt: skip
def _road_morf_auc(batch: ScoredBatch) -> Tensor:
    return road(batch.hm, batch.x, batch.result, batch.targets).auc


@metric("road_lerf_auc", higher=True, perturbs=True,
        summary="area under ROAD, bottom pixels imputed first (Rong et al. 2022)")  # fmt: skip
def _road_lerf_auc(batch: ScoredBatch) -> Tensor:
    return road(batch.hm, batch.x, batch.result, batch.targets, order="lerf").auc
