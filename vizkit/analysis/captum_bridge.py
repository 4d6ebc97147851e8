"""Thin wrappers over captum's input attributions, returning `SaliencyResult` pixel maps.

captum does the attribution; vizkit resolves targets like every other analysis (int, B ints, a
callable on the logits, or None for the argmax), sizes the passes of copies (interpolation
steps, occluded images) by ``max_bytes`` (`vizkit.hooks.passes`) and reduces the channel axis to
one map per image.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, Target, frozen_parameters
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import (
    check_count,
    check_images,
    check_number,
    check_size,
    check_values_finite,
)
from ..hooks.passes import images_per_pass
from ..hooks.targets import call_target, is_score_target, model_logits, target_indices
from ..methods.registry import saliency_method
from .saliency_result import SaliencyResult

__all__ = [
    "captum_attr",
    "captum_inputs",
    "captum_result",
    "image_rows",
    "integrated_gradients",
    "occlusion",
    "saliency",
]


def captum_attr():
    """``captum.attr``, imported on first use (0.7 s: it loads IPython and matplotlib)."""
    import captum.attr

    return captum.attr


def captum_inputs(
    model, x: Tensor, target: Target
) -> tuple[HookedModel, Tensor, Callable, Tensor | None]:
    """HookedModel, batch on its device, captum forward function ``(inputs, rows) -> scores``
    and captum target (B,) (None for a score target). Pass ``additional_forward_args=(rows,)``
    with ``rows`` (B,) the images' indices (`image_rows`): captum expands them with the inputs
    it copies (noise samples, interpolation steps), so a score that differs by image follows
    its copies. The copies captum makes reach the model in the batch's dtype (its noise is
    float32, which a bfloat16 or float16 model refuses)."""
    hm = as_hooked(model)
    x = check_images(hm.model, x).detach().requires_grad_(True)  # captum differentiates x

    def run(inputs: Tensor) -> object:
        return hm.model(inputs.to(x.dtype))

    if is_score_target(target):
        return hm, x, lambda inputs, rows: call_target(target, run(inputs), rows), None
    with torch.no_grad():
        logits = model_logits(hm(x))
    return hm, x, lambda inputs, rows: model_logits(run(inputs)), target_indices(logits, target)


def image_rows(x: Tensor) -> Tensor:
    """(B,) the index of each image of x (B, C, H, W), for captum's additional forward args."""
    return torch.arange(len(x), device=x.device)


def captum_result(attributions: Tensor, method: str, reduce: str, targets, options: dict):
    """(B, C, H, W) attributions -> a `SaliencyResult` of (B, H, W) maps, channels reduced by
    ``reduce`` ("sum", "abs_max" or the mean)."""
    check_values_finite(f"The {method} attributions", attributions)
    if reduce == "sum":
        maps = attributions.sum(1)
    elif reduce == "abs_max":
        maps = attributions.abs().amax(1)
    else:
        maps = attributions.mean(1)
    return SaliencyResult(
        maps=maps.detach().float(),
        method=method,
        image_size=tuple(attributions.shape[-2:]),
        options={**options, "channel_reduction": reduce},
        targets=targets,
    )


@saliency_method(
    "integrated_gradients", needs=("gradients",), default=True,
    summary="gradients integrated from a baseline (Sundararajan et al. 2017; captum)",
)  # fmt: skip
@analysis_contract
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
    baseline = _check_baseline(baseline, x)
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
                for images, start, chosen, rows in _image_chunks(x, baseline, targets, per_pass)
            ]
        )
    options = {"n_steps": n_steps, "baseline": _describe(baseline), "images_per_pass": per_pass}
    return captum_result(attributions, "integrated_gradients", "sum", targets, options)


@saliency_method(
    "saliency", needs=("gradients",),
    summary="absolute gradient of the target per pixel (Simonyan et al. 2014; captum)",
)  # fmt: skip
@analysis_contract
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
        window: (h, w) occluded at a time; default the patch size (ViTs) or 1/8 of the image.
        stride: default the window (non-overlapping).
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
            for images, _, chosen, rows in _image_chunks(x, baseline, targets, per_pass)
        ]
    )
    options = {
        "window": window,
        "stride": stride,
        "baseline": baseline,
        "images_per_pass": per_pass,
    }
    return captum_result(attributions, "occlusion", "mean", targets, options)


def _image_chunks(
    x: Tensor, baseline: float | Tensor, targets: Tensor | None, size: int
) -> list[tuple[Tensor, float | Tensor, Tensor | None, Tensor]]:
    """The batch x (B, C, H, W) with its baseline, targets (B,) and image rows (B,) in chunks
    of ``size`` images (one chunk when B <= size)."""
    images = x.split(size)
    starts = (
        baseline.expand_as(x).split(size)
        if isinstance(baseline, Tensor)
        else [baseline] * len(images)
    )
    chosen = targets.split(size) if targets is not None else [None] * len(images)
    return list(zip(images, starts, chosen, image_rows(x).split(size), strict=True))


def _check_baseline(baseline: float | Tensor, x: Tensor) -> float | Tensor:
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
