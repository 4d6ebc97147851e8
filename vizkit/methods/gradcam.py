"""Grad-CAM (Selvaraju et al. 2017, "Grad-CAM: Visual Explanations from Deep Networks via
Gradient-based Localization", Eq. 1-2): each channel of the activation weighted by its mean
gradient over positions, relu(sum_c w_c A_c), on a ViT's tokens or a CNN's feature maps (the
template: `vizkit.analysis.gradcam_maps`)."""

from __future__ import annotations

from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps, channel_cam
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.selector import LayerSpec
from .registry import saliency_method

__all__ = ["gradcam"]


@saliency_method(
    "gradcam", needs=("gradients", "layer"), default=True,
    summary="channels weighted by their mean gradient (Selvaraju et al. 2017)",
)  # fmt: skip
@analysis_contract(videos=True)
def gradcam(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    layer: LayerSpec | None = None,
) -> SaliencyResult:
    """Grad-CAM maps of a batch.

    Args:
        model: a timm ViT-family model or CNN, or a HookedModel.
        x: image batch (B, C, H, W), or a video model's clips (B, T, C, H, W).
        target: int, B ints, a callable on the logits, or None for each sample's argmax.
        layer: the activation: an int counting `gradcam_layers` (one per block or stage,
            negative from the end; default the last), a module path (``"blocks.3"``: that
            block's entry of `gradcam_layers`) or any hook name.

    Returns:
        `SaliencyResult` with maps (B, gh, gw) for token activations (patch grid; a video's
            (B, T', gh, gw)) or (B, h, w) for feature maps; options ``layer`` (hook name) and
            ``layer_index`` (its position in `gradcam_layers`, None for another activation).
    """
    return cam_maps(model, x, target, layer, "gradcam", _maps)


def _maps(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
    """(B, h, w) each channel weighted by its mean gradient (Eq. 1-2)."""
    return channel_cam(found, found.grad.mean((2, 3)))
