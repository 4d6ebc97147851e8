"""Occlusion (Zeiler and Fergus 2014, "Visualizing and Understanding Convolutional Networks",
Sec. 4.2): the drop of the target score when a window of the image is set to a baseline.

The windows slide as captum's ``Occlusion`` slides them (offsets 0, s, 2s, ... up to the last
that starts inside the image, the last one cut at the edge), and a pixel's value is the mean
drop over the windows that cover it: the same maps as captum's, mean over channels (tested
against it). vizkit runs the occluded copies itself, a pass of ``max_bytes`` at a time, and
adds each window's drop to a (B, H, W) map; captum kept two (B, C, H, W) sums beside the
copies."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import check_images, check_number, check_size, check_values_finite
from ..hooks.passes import images_per_pass
from ..hooks.scores import call_target, is_score_target, model_logits, target_indices
from .registry import saliency_method

__all__ = ["occlusion"]


@saliency_method(
    "occlusion", needs=("forwards",),
    summary="the score lost when a window is occluded (Zeiler & Fergus 2014)",
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
    """The drop of the target score when a window is set to ``baseline``, per pixel the mean
    over the windows covering it; maps (B, H, W).

    Args:
        target: the class to explain: int, B ints, a callable on the logits, or None (argmax).
        window: (h, w) occluded at a time; default the patch size (ViTs) or 1/8 of the image.
        stride: default the window (non-overlapping); at most the window.
        baseline: the value an occluded window is set to, in the model's normalized space.
        max_bytes: the most one forward of occluded images may hold (default: as much as a
            forward of the batch; `vizkit.hooks.passes`).
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    per_pass = images_per_pass(hm.model, x, max_bytes, False, "occlusion")
    baseline = check_number("baseline", baseline)
    image_size = tuple(x.shape[-2:])
    if window is None:
        pe = getattr(hm.model, "patch_embed", None)
        window = tuple(pe.patch_size) if pe is not None else tuple(s // 8 for s in image_size)
    window = check_size("window", window, image_size)
    stride = check_size("stride", window if stride is None else stride, image_size)
    if any(s > w for s, w in zip(stride, window, strict=True)):
        raise ValueError(
            f"stride {stride} is larger than the window {window}: pixels between windows would "
            f"never be occluded. Pass a stride of at most {window}, or a larger window."
        )
    covers = [_windows(*side, x.device) for side in zip(image_size, window, stride, strict=True)]
    with torch.no_grad():
        clean, targets = _clean_scores(hm.model, x, target, per_pass)
        drops = clean[:, None] - _occluded_scores(hm.model, x, target, targets, covers, baseline,
                                                  per_pass)  # fmt: skip
    rows, cols = (c.double() for c in covers)
    grid = drops.double().view(len(x), len(rows), len(cols))  # (B, windows down, across)
    total = rows.T @ grid @ cols  # (B, H, W): each pixel's drops summed over its windows
    maps = total / (rows.sum(0)[:, None] * cols.sum(0)[None, :])
    check_values_finite("The occlusion maps", maps)
    options = {"window": window, "stride": stride, "baseline": baseline,
               "images_per_pass": per_pass}  # fmt: skip
    return SaliencyResult(maps=maps.float(), method="occlusion", image_size=image_size,
                          options=options, targets=targets)  # fmt: skip


def _windows(size: int, window: int, stride: int, device: torch.device) -> Tensor:
    """(n, size) bool: the pixels each window covers along one side, at offsets 0, stride, ...
    (captum's count, ceil((size - window) / stride) + 1), the last cut at the edge."""
    starts = torch.arange(math.ceil((size - window) / stride) + 1, device=device) * stride
    pixels = torch.arange(size, device=device)
    return (pixels >= starts[:, None]) & (pixels < starts[:, None] + window)


def _scores(output: object, target: Target, targets: Tensor | None, rows: Tensor) -> Tensor:
    """(n,) the explained score of each output row (of image ``rows``): the target class's
    logit, or the callable target's value."""
    if targets is None:
        return call_target(target, output, rows).float()
    return model_logits(output).gather(1, targets[rows][:, None])[:, 0].float()


def _clean_scores(
    model: nn.Module, x: Tensor, target: Target, per_pass: int
) -> tuple[Tensor, Tensor | None]:
    """(B,) scores of the images as they are, and (B,) the classes explained (None for a
    score target), ``per_pass`` images at a time."""
    chunks = x.split(per_pass)
    if is_score_target(target):
        rows = torch.arange(len(x), device=x.device).split(per_pass)
        scores = [_scores(model(c), target, None, r) for c, r in zip(chunks, rows, strict=True)]
        return torch.cat(scores), None
    logits = torch.cat([model_logits(model(images)) for images in chunks])
    targets = target_indices(logits, target)
    return logits.gather(1, targets[:, None])[:, 0].float(), targets


def _occluded_scores(
    model: nn.Module, x: Tensor, target: Target, targets: Tensor | None,
    covers: list[Tensor], baseline: float, per_pass: int,
) -> Tensor:  # fmt: skip
    """(B, n_rows * n_cols) the score of each image with each window set to ``baseline``,
    ``per_pass`` occluded images per forward."""
    rows, cols = covers
    windows = len(rows) * len(cols)
    scores = torch.empty(len(x) * windows, device=x.device)
    for start in range(0, len(scores), per_pass):
        pair = torch.arange(start, min(start + per_pass, len(scores)), device=x.device)
        image, at = pair // windows, pair % windows
        hidden = rows[at // len(cols), :, None] & cols[at % len(cols), None, :]  # (n, H, W)
        occluded = x[image].masked_fill_(hidden[:, None], baseline)
        scores[pair] = _scores(model(occluded), target, targets, image)
    return scores.view(len(x), windows)
