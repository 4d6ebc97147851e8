"""SmoothGrad (Smilkov et al. 2017, "SmoothGrad: removing noise by adding noise", Eq. 3): the
input gradient's magnitude averaged over ``samples`` copies of each image with Gaussian noise of
standard deviation ``noise`` times the batch's value range (the paper's 10-20 %); captum's
NoiseTunnel over Saliency, ``batch_size`` noisy copies per pass."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.captum_bridge import (
    captum_attr,
    captum_inputs,
    captum_result,
    captum_seeded,
    image_rows,
)
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.hooked_model import frozen_parameters
from ..hooks.inputs import check_count, check_number
from .registry import saliency_method

__all__ = ["smoothgrad"]


@saliency_method(
    "smoothgrad", needs=("gradients",),
    summary="absolute input gradient averaged over noisy copies (Smilkov et al. 2017; captum)",
)  # fmt: skip
@analysis_contract
def smoothgrad(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None, samples: int = 16,
    noise: float = 0.15, batch_size: int = 32, seed: int = 0,
) -> SaliencyResult:  # fmt: skip
    """SmoothGrad maps (B, H, W), the max over channels of the mean |gradient|; the noise is
    drawn from ``seed`` (the caller's random state is left as it was)."""
    samples = check_count("samples", samples)
    noise = check_number("noise", noise, 0.0, low_open=True)
    batch_size = check_count("batch_size", batch_size)
    seed = check_count("seed", seed, 0)
    hm, x, forward, targets = captum_inputs(model, x, target)
    stdev = float(noise * (x.max() - x.min()).detach())
    tunnel = captum_attr().NoiseTunnel(captum_attr().Saliency(forward))
    with frozen_parameters(hm.model), captum_seeded(seed, x.device):
        attributions = tunnel.attribute(
            x, target=targets, additional_forward_args=(image_rows(x),), nt_type="smoothgrad",
            nt_samples=samples, nt_samples_batch_size=batch_size, stdevs=stdev, abs=True,
        )  # fmt: skip
    options = {"samples": samples, "noise": noise, "batch_size": batch_size, "seed": seed}
    return captum_result(attributions, "smoothgrad", "abs_max", targets, options)
