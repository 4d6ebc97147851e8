"""GradientSHAP (Lundberg & Lee 2017, "A Unified Approach to Interpreting Model Predictions",
as captum's GradientShap computes it: expected gradients). Each of ``samples`` copies of an
image adds Gaussian noise of standard deviation ``noise`` (x'), draws a baseline b uniformly
from ``baselines`` and a point alpha ~ U(0, 1) between them; its attribution is
(x' - b) * grad f(b + alpha (x' - b)). The maps are the mean over copies, channels summed. The
copies run in passes sized by ``max_bytes`` (`vizkit.hooks.passes`), each drawing from its own
seed (`noisy_copies`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.captum_bridge import captum_inputs, captum_result
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count, check_number
from ..hooks.passes import images_per_pass
from .noisy_copies import mean_over_copies, target_gradient, working_dtype
from .registry import saliency_method

__all__ = ["gradientshap"]


@saliency_method(
    "gradientshap", needs=("gradients",),
    summary="expected gradients times the input's difference to baselines (captum's)",
)  # fmt: skip
@analysis_contract(videos=True)
def gradientshap(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    baselines: Tensor | None = None, samples: int = 16, noise: float = 0.0,
    max_bytes: int | None = None, seed: int = 0,
) -> SaliencyResult:  # fmt: skip
    """GradientSHAP maps (B, H, W). ``baselines``: (K, C, H, W) images the expectation draws
    from (default: black, i.e. zeros, and the batch's mean image); ``noise``: the standard
    deviation of the Gaussian noise added to the images; ``max_bytes``: the most one pass of
    copies may hold (default: as much as one gradient pass of the batch)."""
    samples = check_count("samples", samples)
    noise = check_number("noise", noise, 0.0)
    seed = check_count("seed", seed, 0)
    hm, x, forward, targets = captum_inputs(model, x, target)
    if baselines is None:
        baselines = torch.stack([torch.zeros_like(x[0]), x.mean(0)])
    elif not isinstance(baselines, Tensor) or baselines.shape[1:] != x.shape[1:]:
        raise ValueError(
            f"baselines must be (K, {', '.join(map(str, x.shape[1:]))}) images like the batch; "
            f"got {getattr(baselines, 'shape', type(baselines).__name__)}."
        )
    per_pass = images_per_pass(hm.model, x, max_bytes, gradients=True, method="gradientshap")
    images = x.detach().to(working_dtype(x))
    starts = baselines.detach().to(x.device, images.dtype)

    def expected_gradients(rows: Tensor, generators: list[torch.Generator]) -> Tensor:
        moved, chosen, alphas = images[rows], [], []
        shifts = []
        for g in generators:  # each copy: its noise (if any), then its baseline, then its point
            if noise:
                shifts.append(torch.randn(x.shape[1:], generator=g, device=x.device,
                                          dtype=images.dtype))  # fmt: skip
            chosen.append(torch.randint(len(starts), (), generator=g, device=x.device))
            alphas.append(torch.rand((), generator=g, device=x.device, dtype=images.dtype))
        if shifts:
            moved = moved + noise * torch.stack(shifts)
        start = starts[torch.stack(chosen)]
        points = start + torch.stack(alphas)[:, None, None, None] * (moved - start)
        return (moved - start) * target_gradient(forward, points, rows, targets)

    with frozen_parameters(hm.model):
        attributions = mean_over_copies(x, samples, per_pass, seed, expected_gradients)
    options = {"samples": samples, "noise": noise, "baselines": len(baselines),
               "images_per_pass": per_pass, "seed": seed}  # fmt: skip
    return captum_result(attributions, "gradientshap", "sum", targets, options)
