"""Score-CAM (Wang et al. 2020, "Score-CAM: Score-Weighted Visual Explanations for CNNs",
Eq. 5-8): each channel's map, upsampled to the image and min-max scaled, masks the image; the
target score of each masked image, softmaxed over the channels, weights the channels. No
gradients; one forward per channel and image, in passes sized by ``max_bytes`` on the device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.gradcam_maps import CamActivation, cam_maps, channel_cam
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.passes import images_per_pass
from ..hooks.selector import LayerSpec
from .perturbation import chunked_scores, score_of
from .registry import saliency_method

__all__ = ["scorecam"]

EPS = 1e-8  # a constant channel masks with zeros instead of dividing by zero


@saliency_method(
    "scorecam", needs=("layer", "forwards"),
    summary="channels weighted by the score of the image they mask (Wang et al. 2020)",
)  # fmt: skip
@analysis_contract
def scorecam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None, max_bytes: int | None = None,
) -> SaliencyResult:  # fmt: skip
    """Score-CAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`);
    ``max_bytes``: the most one forward of perturbed copies may hold (default: as much as a
    forward of the batch; `vizkit.hooks.passes`)."""

    def maps_of(found: CamActivation, hm: HookedModel, x: Tensor) -> Tensor:
        chunk = images_per_pass(hm.model, x, max_bytes, False, "scorecam")
        weights = torch.stack([
            _channel_scores(found, hm, x, target, b, chunk).softmax(0)
            for b in range(len(x))
        ])  # fmt: skip
        return channel_cam(found, weights.to(found.act.dtype))

    return cam_maps(model, x, target, layer, "scorecam", maps_of, gradients=False,
                    max_bytes=max_bytes)  # fmt: skip


def _channel_scores(
    found: CamActivation, hm: HookedModel, x: Tensor, target: Target, b: int, chunk: int
) -> Tensor:
    """(C,) the target score of image ``b`` masked by each channel's scaled, upsampled map
    (bilinear with aligned corners, as the reference implementation); the masks are made a
    pass at a time (all of an image's would be C x H x W)."""

    def make(start: int, stop: int) -> Tensor:
        masks = F.interpolate(found.act[b : b + 1, start:stop].float(), size=x.shape[-2:],
                              mode="bilinear", align_corners=True)[0]  # fmt: skip
        low = masks.flatten(1).min(1).values[:, None, None]
        high = masks.flatten(1).max(1).values[:, None, None]
        masks.sub_(low).div_(high - low + EPS)  # in place: one (n, H, W) beside the copies
        return x[b] * masks.to(x.dtype)[:, None]  # (n, C, H, W)

    channels = found.act.shape[1]
    return chunked_scores(hm, make, channels, chunk, score_of(found.logits, target, b))
