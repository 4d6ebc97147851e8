"""What vizkit's methods over captum's input attributions share (`vizkit.methods`: integrated
gradients, saliency, SmoothGrad, GradientSHAP), returning `SaliencyResult` pixel maps.

captum does the attribution; vizkit resolves targets like every other analysis (int, B ints, a
callable on the logits, or None for the argmax), sizes the passes of copies (interpolation
steps, noise samples) by ``max_bytes`` (`vizkit.hooks.passes`) and reduces the channel axis to
one map per image.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..hooks import HookedModel, Target
from ..hooks.contract import as_hooked
from ..hooks.inputs import check_images, check_values_finite
from ..hooks.scores import call_target, is_score_target, model_logits, target_indices
from .saliency_result import SaliencyResult

__all__ = [
    "captum_attr",
    "captum_inputs",
    "captum_result",
    "image_chunks",
    "image_rows",
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
    ``reduce`` ("sum", "abs_max" or the mean); a video's (B, T, C, H, W) -> (B, T, H, W)."""
    check_values_finite(f"The {method} attributions", attributions)
    if reduce == "sum":
        maps = attributions.sum(-3)
    elif reduce == "abs_max":
        maps = attributions.abs().amax(-3)
    else:
        maps = attributions.mean(-3)
    return SaliencyResult(
        maps=maps.detach().float(),
        method=method,
        image_size=tuple(attributions.shape[-2:]),
        options={**options, "channel_reduction": reduce},
        targets=targets,
        frames=attributions.shape[1] if attributions.ndim == 5 else None,
    )


def image_chunks(
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
