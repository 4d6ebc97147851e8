"""SmoothGrad (Smilkov et al. 2017, "SmoothGrad: removing noise by adding noise", Eq. 3): the
input gradient's magnitude averaged over ``samples`` copies of each image with Gaussian noise of
standard deviation ``noise`` times the batch's value range (the paper's 10-20 %), as captum's
NoiseTunnel over Saliency (``abs=True``) computes it; the copies run in passes sized by
``max_bytes`` (`vizkit.hooks.passes`), each copy's noise from its own seed (`noisy_copies`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.captum_bridge import captum_inputs, captum_result
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count
from ..hooks.passes import images_per_pass
from .noisy_copies import mean_over_copies, noise_deviation, noisy_copies, target_gradient
from .registry import saliency_method

__all__ = ["smoothgrad"]


@saliency_method(
    "smoothgrad", needs=("gradients",),
    summary="absolute input gradient averaged over noisy copies (Smilkov et al. 2017)",
)  # fmt: skip
@analysis_contract(videos=True)
def smoothgrad(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None, samples: int = 16,
    noise: float = 0.15, max_bytes: int | None = None, seed: int = 0,
) -> SaliencyResult:  # fmt: skip
    """SmoothGrad maps (B, H, W), the max over channels of the mean |gradient|; the noise is
    drawn from ``seed`` (the caller's random state is left as it was), as `vk.smoothed` draws
    it for any method; ``noise`` 0 gives the input gradient. ``max_bytes``: the most one pass
    of noisy copies may hold (default: as much as one gradient pass of the batch)."""
    samples = check_count("samples", samples)
    seed = check_count("seed", seed, 0)
    hm, x, forward, targets = captum_inputs(model, x, target)
    stdev = noise_deviation(x, noise)
    per_pass = images_per_pass(hm.model, x, max_bytes, gradients=True, method="smoothgrad")

    def absolute_gradients(rows: Tensor, generators: list[torch.Generator]) -> Tensor:
        noisy = noisy_copies(x, rows, generators, stdev)
        return target_gradient(forward, noisy, rows, targets).abs()

    with frozen_parameters(hm.model):
        attributions = mean_over_copies(x, samples, per_pass, seed, absolute_gradients)
    options = {"samples": samples, "noise": noise, "images_per_pass": per_pass, "seed": seed}
    return captum_result(attributions, "smoothgrad", "abs_max", targets, options)
