"""Grad-CAM++ (Chattopadhyay et al. 2018, "Grad-CAM++: Generalized Gradient-Based Visual
Explanations", Eq. 19): channel weights sum_ij relu(G_ij) a_ij with
a_ij = G_ij² / (2 G_ij² + sum_ab A_ab G_ij³), the paper's closed form applied to the target
logit's gradients (as its implementation and pytorch-grad-cam do)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps, channel_cam
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["gradcam_pp"]

EPS = 1e-6  # keeps the denominator of a_ij off zero (the reference implementation's)


@saliency_method(
    "gradcam_pp", needs=("gradients", "layer"),
    summary="positive gradients weighted per position (Chattopadhyay et al. 2018)",
)  # fmt: skip
@analysis_contract(videos=True)
def gradcam_pp(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None,
) -> SaliencyResult:  # fmt: skip
    """Grad-CAM++ maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`)."""
    return cam_maps(model, x, target, layer, "gradcam_pp", _maps)


def _maps(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
    """(B, h, w) each channel weighted by its positive gradients times alpha (Eq. 19)."""
    grad, act = found.grad, found.act
    squared = grad**2
    denominator = 2 * squared + act.sum((2, 3), keepdim=True) * squared * grad + EPS
    alpha = torch.where(grad != 0, squared / denominator, torch.zeros_like(grad))
    weights = (grad.clamp_min(0) * alpha).sum((2, 3))
    return channel_cam(found, weights)
