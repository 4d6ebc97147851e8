"""Saliency (Simonyan, Vedaldi and Zisserman 2014, "Deep Inside Convolutional Networks", Sec. 3.1):
the absolute gradient of the target score per pixel, by captum's Saliency."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.captum_bridge import captum_attr, captum_inputs, captum_result, image_rows
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.gradient_graph import frozen_parameters
from .registry import saliency_method

__all__ = ["saliency"]


@saliency_method(
    "saliency", needs=("gradients",),
    summary="absolute gradient of the target per pixel (Simonyan et al. 2014; captum)",
)  # fmt: skip
@analysis_contract(videos=True)
def saliency(model: nn.Module | HookedModel, x: Tensor, target: Target = None) -> SaliencyResult:
    """captum Saliency (Simonyan et al. 2014): |d target / d pixel|, max over channels
    (B, H, W)."""
    hm, x, forward, targets = captum_inputs(model, x, target)
    with frozen_parameters(hm.model):  # gradients of the input only
        attributions = (
            captum_attr()
            .Saliency(forward)
            .attribute(x, target=targets, additional_forward_args=(image_rows(x),), abs=True)
        )
    return captum_result(attributions, "saliency", "abs_max", targets, {})
