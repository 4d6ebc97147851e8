"""LayerCAM (Jiang et al. 2021, "LayerCAM: Exploring Hierarchical Class Activation Maps", Eq. 3
and 4): relu(sum_c relu(G_c) ⊙ A_c), each position's activation weighted by its own positive
gradient."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["layercam"]


@saliency_method(
    "layercam", needs=("gradients", "layer"),
    summary="activation weighted by its own positive gradient (Jiang et al. 2021)",
)  # fmt: skip
@analysis_contract(videos=True)
def layercam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None,
) -> SaliencyResult:  # fmt: skip
    """LayerCAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`)."""
    return cam_maps(model, x, target, layer, "layercam", _maps)


def _maps(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
    return (found.grad.clamp_min(0) * found.act).sum(1).clamp_min(0)
