"""GradientSHAP (Lundberg & Lee 2017, "A Unified Approach to Interpreting Model Predictions",
as captum's GradientShap: expected gradients): input gradients at random points between the
image (with Gaussian noise) and baselines drawn from ``baselines``, times the difference to the
baseline, averaged over ``samples``; channels summed."""

from __future__ import annotations

import torch
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

__all__ = ["gradientshap"]


@saliency_method(
    "gradientshap", needs=("gradients",),
    summary="expected gradients times the input's difference to baselines (captum)",
)  # fmt: skip
@analysis_contract
def gradientshap(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    baselines: Tensor | None = None, samples: int = 16, noise: float = 0.0, seed: int = 0,
) -> SaliencyResult:  # fmt: skip
    """GradientSHAP maps (B, H, W). ``baselines``: (K, C, H, W) images the expectation draws
    from (default: black, i.e. zeros, and the batch's mean image); ``noise``: the standard
    deviation of the Gaussian noise added to the images."""
    samples = check_count("samples", samples)
    noise = check_number("noise", noise, 0.0)
    hm, x, forward, targets = captum_inputs(model, x, target)
    if baselines is None:
        baselines = torch.stack([torch.zeros_like(x[0]), x.mean(0)]).detach()
    elif not isinstance(baselines, Tensor) or baselines.shape[1:] != x.shape[1:]:
        raise ValueError(
            f"baselines must be (K, {', '.join(map(str, x.shape[1:]))}) images like the batch; "
            f"got {getattr(baselines, 'shape', type(baselines).__name__)}."
        )
    seed = check_count("seed", seed, 0)
    with frozen_parameters(hm.model), captum_seeded(seed, x.device):
        attributions = (
            captum_attr()
            .GradientShap(forward)
            .attribute(
                x,
                baselines=baselines.to(x),
                target=targets,
                n_samples=samples,
                stdevs=noise,
                additional_forward_args=(image_rows(x),),
            )
        )
    options = {"samples": samples, "noise": noise, "baselines": len(baselines), "seed": seed}
    return captum_result(attributions, "gradientshap", "sum", targets, options)
