"""Occlusion (Zeiler and Fergus 2014, "Visualizing and Understanding Convolutional Networks",
Sec. 4.2): the drop of the target score when a window of the image is set to a baseline, by
captum's Occlusion."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.captum_bridge import captum_attr, captum_inputs, captum_result, image_chunks
from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_number, check_size
from ..hooks.passes import images_per_pass
from .registry import saliency_method

__all__ = ["occlusion"]


@saliency_method(
    "occlusion", needs=("forwards",),
    summary="the score lost when a window is occluded (Zeiler & Fergus 2014; captum)",
)  # fmt: skip
@analysis_contract
def occlusion(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    window: int | tuple[int, int] | None = None,
    stride: int | tuple[int, int] | None = None,
    baseline: float = 0.0,
    max_bytes: int | None = None,
) -> SaliencyResult:
    """captum Occlusion: the drop of the target score when a window is set to ``baseline``;
    maps (B, H, W), mean over channels.

    Args:
        target: the class to explain: int, B ints, a callable on the logits, or None (argmax).
        window: (h, w) occluded at a time; default the patch size (ViTs) or 1/8 of the image.
        stride: default the window (non-overlapping).
        baseline: the value an occluded window is set to, in the model's normalized space.
        max_bytes: the most one forward of occluded images may hold (default: as much as a
            forward of the batch; `vizkit.hooks.passes`).
    """
    hm, x, forward, targets = captum_inputs(model, x, target)
    per_pass = images_per_pass(hm.model, x, max_bytes, False, "occlusion")
    baseline = check_number("baseline", baseline)
    image_size = tuple(x.shape[-2:])
    if window is None:
        pe = getattr(hm.model, "patch_embed", None)
        window = tuple(pe.patch_size) if pe is not None else tuple(s // 8 for s in image_size)
    window = check_size("window", window, image_size)
    stride = check_size("stride", window if stride is None else stride, image_size)
    method = captum_attr().Occlusion(forward)
    attributions = torch.cat(
        [
            method.attribute(
                images,
                sliding_window_shapes=(x.shape[1], *window),
                strides=(x.shape[1], *stride),
                baselines=baseline,
                target=chosen,
                additional_forward_args=(rows,),
                perturbations_per_eval=max(1, per_pass // len(images)),
            )
            for images, _, chosen, rows in image_chunks(x, baseline, targets, per_pass)
        ]
    )
    options = {
        "window": window,
        "stride": stride,
        "baseline": baseline,
        "images_per_pass": per_pass,
    }
    return captum_result(attributions, "occlusion", "mean", targets, options)
