"""Integrated gradients (Sundararajan, Taly and Yan 2017, "Axiomatic Attribution for Deep
Networks", Eq. 1): the gradients along the straight path from a baseline to the image, times
the difference, by captum's IntegratedGradients."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.captum_bridge import captum_attr, captum_inputs, captum_result, image_chunks
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from ..hooks.inputs import check_count, check_number, check_values_finite
from ..hooks.passes import images_per_pass
from .registry import saliency_method

__all__ = ["integrated_gradients"]


@saliency_method(
    "integrated_gradients", needs=("gradients",), default=True,
    summary="gradients integrated from a baseline (Sundararajan et al. 2017; captum)",
)  # fmt: skip
@analysis_contract(videos=True)
def integrated_gradients(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    baseline: float | Tensor = 0.0,
    n_steps: int = 50,
    max_bytes: int | None = None,
) -> SaliencyResult:
    """captum IntegratedGradients; maps (B, H, W) are the attributions summed over channels
    (signed). ``baseline``: a value or a (B, C, H, W) tensor, in the model's normalized space.
    ``max_bytes``: the most one forward and backward pass of interpolated images may hold
    (default: as much as one gradient pass of the batch; `vizkit.hooks.passes`)."""
    n_steps = check_count("n_steps", n_steps)
    hm, x, forward, targets = captum_inputs(model, x, target)
    baseline = _checked_baseline(baseline, x)
    per_pass = images_per_pass(hm.model, x, max_bytes, True, "integrated_gradients")
    method = captum_attr().IntegratedGradients(forward)
    with frozen_parameters(hm.model):  # gradients of the input only
        attributions = torch.cat(
            [
                method.attribute(
                    images,
                    baselines=start,
                    target=chosen,
                    additional_forward_args=(rows,),
                    n_steps=n_steps,
                    internal_batch_size=per_pass,
                )
                for images, start, chosen, rows in image_chunks(x, baseline, targets, per_pass)
            ]
        )
    options = {"n_steps": n_steps, "baseline": _describe(baseline), "images_per_pass": per_pass}
    return captum_result(attributions, "integrated_gradients", "sum", targets, options)


def _checked_baseline(baseline: float | Tensor, x: Tensor) -> float | Tensor:
    """A finite number, or a finite tensor that broadcasts to the batch ``x`` (B, C, H, W)."""
    if not isinstance(baseline, Tensor):
        return check_number("baseline", baseline)
    check_values_finite("baseline", baseline)
    try:
        torch.broadcast_shapes(baseline.shape, x.shape)
    except RuntimeError:
        raise ValueError(
            f"baseline of shape {tuple(baseline.shape)} does not broadcast to the batch "
            f"{tuple(x.shape)}; pass a number, a (C, 1, 1) tensor or one of the batch's shape."
        ) from None
    return baseline.to(device=x.device, dtype=x.dtype)


def _describe(baseline: float | Tensor) -> float | str:
    return f"tensor{tuple(baseline.shape)}" if isinstance(baseline, Tensor) else baseline
