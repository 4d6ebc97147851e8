"""Score-CAM (Wang et al. 2020, "Score-CAM: Score-Weighted Visual Explanations for CNNs",
Eq. 5-8): each channel's map, upsampled to the image and min-max scaled, masks the image; the
target score of each masked image, softmaxed over the channels, weights the channels. No
gradients; one forward per channel and image, in passes sized by ``max_bytes`` on the device.

A video model's clip (T, C, H, W) is masked as a whole: a channel's map over the clip's
T' x gh x gw tokens is upsampled in space on each token frame, each token frame spanning its
tubelet's T / T' frames in time, and min-max scaled over the clip (the paper's normalization, over
space-time); the weights are the softmax of the masked clips' scores, as for images."""

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
@analysis_contract(videos=True)
def scorecam(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    layer: LayerSpec | None = None, max_bytes: int | None = None,
) -> SaliencyResult:  # fmt: skip
    """Score-CAM maps (B, h, w) of ``layer`` (default and grid as `vizkit.gradcam`) for images
    x (B, C, H, W); for a video model's clips (B, T, C, H, W), (B, T', gh, gw) on its token
    frames. ``max_bytes``: the most one forward of perturbed copies (images or clips) may hold
    (default: as much as a forward of the batch; `vizkit.hooks.passes`)."""

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
    """(C,) the target score of image (or clip) ``b`` masked by each channel's upsampled map
    (`_upsampled`), min-max scaled over the image (the clip); the masks are made a pass
    at a time (all of an image's would be C x H x W)."""

    def make(start: int, stop: int) -> Tensor:
        masks = _upsampled(found, b, start, stop, x.shape)
        low = masks.flatten(1).min(1).values
        high = masks.flatten(1).max(1).values
        shape = (-1,) + (1,) * (masks.ndim - 1)  # in place: one set of masks beside the copies
        masks.sub_(low.view(shape)).div_((high - low + EPS).view(shape))
        return x[b] * masks.to(x.dtype).unsqueeze(-3)  # (n, C, H, W) or clips (n, T, C, H, W)

    channels = found.act.shape[1]
    return chunked_scores(hm, make, channels, chunk, score_of(found.logits, target, b))


def _upsampled(found: CamActivation, b: int, start: int, stop: int, shape: torch.Size) -> Tensor:
    """Channels ``start:stop`` of sample ``b``'s activation upsampled to the input of ``shape``
    (bilinear with aligned corners, as the reference implementation): (n, H, W) for images
    (B, C, H, W); for clips (B, T, C, H, W) each token frame upsampled in space and repeated
    over its tubelet's T / T' frames, (n, T, H, W).

    Raises:
        ValueError: clips whose activation has no token frames that tile their T frames.
    """
    channels = found.act[b, start:stop].float()  # (n, h, w); a video's (n, T' gh, gw)
    if len(shape) == 4:
        return F.interpolate(channels[None], size=shape[-2:], mode="bilinear",
                             align_corners=True)[0]  # fmt: skip
    frames = None if found.layout is None else found.layout.frames
    if frames is None or shape[1] % frames:
        raise ValueError(
            f"Score-CAM masks a clip of {shape[1]} frames through token frames, but {found.layer} "
            f"has {'no token frames' if frames is None else f'{frames} token frames'}; choose a "
            "token activation of the video model (layer=None: its default)."
        )
    grid = channels.unflatten(1, (frames, -1))  # (n, T', gh, gw)
    up = F.interpolate(grid, size=shape[-2:], mode="bilinear", align_corners=True)
    return up.repeat_interleave(shape[1] // frames, dim=1)  # (n, T, H, W)
