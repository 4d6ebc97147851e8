"""HiResCAM (Draelos & Carin 2020, "Use HiResCAM instead of Grad-CAM", Eq. 5): the element-wise
product of gradient and activation summed over channels, relu(sum_c G_c ⊙ A_c), which keeps
where the gradient acts instead of averaging it away (faithful for a final linear layer)."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["hirescam"]


@saliency_method(
    "hirescam", needs=("gradients", "layer"),
    summary="gradient times activation per position, summed over channels (Draelos & Carin 2020)",
)  # fmt: skip
@analysis_contract(videos=True)
def hirescam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None,
) -> SaliencyResult:  # fmt: skip
    """HiResCAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`)."""
    return cam_maps(model, x, target, layer, "hirescam", _maps)


def _maps(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
    return (found.grad * found.act).sum(1).clamp_min(0)
