"""XGrad-CAM (Fu et al. 2020, "Axiom-based Grad-CAM", Eq. 13): channel weights
sum_ij G_ij A_ij / sum_ab A_ab, the weighting that satisfies their sensitivity and conservation
axioms."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps, channel_cam
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["xgradcam"]

EPS = 1e-7  # keeps sum_ab A_ab off zero


@saliency_method(
    "xgradcam", needs=("gradients", "layer"),
    summary="gradients weighted by the normalized activation (Fu et al. 2020)",
)  # fmt: skip
@analysis_contract(videos=True)
def xgradcam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None,
) -> SaliencyResult:  # fmt: skip
    """XGrad-CAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`)."""
    return cam_maps(model, x, target, layer, "xgradcam", _maps)


def _maps(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
    """(B, h, w) each channel weighted by its gradient times its activation share (Eq. 13)."""
    act = found.act
    weights = (found.grad * act / (act.sum((2, 3), keepdim=True) + EPS)).sum((2, 3))
    return channel_cam(found, weights)
