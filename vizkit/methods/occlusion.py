"""Occlusion (Zeiler and Fergus 2014, "Visualizing and Understanding Convolutional Networks",
Sec. 4.2): the drop of the target score when a window of the image is set to a baseline.

The windows slide as captum's ``Occlusion`` slides them (offsets 0, s, 2s, ... up to the last
that starts inside the image, the last one cut at the edge), and a pixel's value is the mean
drop over the windows that cover it: the same maps as captum's, mean over channels (tested
against it). vizkit runs the occluded copies itself, a pass of ``max_bytes`` at a time, and
adds each window's drop to a (B, H, W) map; captum kept two (B, C, H, W) sums beside the
copies.

A video model's clips (B, T, C, H, W) are occluded by space-time windows (t, h, w), every
channel of t frames x h x w pixels, sliding over time as over space; the maps are (B, T, H, W),
each pixel of each frame the mean drop over the windows that cover it."""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract, as_hooked
from ..hooks.inputs import (
    check_images,
    check_number,
    check_size,
    check_values_finite,
    video_input,
)
from ..hooks.passes import images_per_pass
from ..hooks.scores import call_target, is_score_target, model_logits, target_indices
from .registry import saliency_method

__all__ = ["occlusion"]

Window = int | tuple[int, int] | tuple[int, int, int]


@saliency_method(
    "occlusion", needs=("forwards",),
    summary="the score lost when a window is occluded (Zeiler & Fergus 2014)",
)  # fmt: skip
@analysis_contract(videos=True)
def occlusion(
    model: nn.Module | HookedModel,
    x: Tensor,
    target: Target = None,
    window: Window | None = None,
    stride: Window | None = None,
    baseline: float = 0.0,
    max_bytes: int | None = None,
) -> SaliencyResult:
    """The drop of the target score when a window is set to ``baseline``, per pixel the mean
    over the windows covering it; maps (B, H, W) of images x (B, C, H, W), or (B, T, H, W) of a
    video model's clips x (B, T, C, H, W).

    Args:
        target: the class to explain: int, B ints, a callable on the logits, or None (argmax).
        window: (h, w) occluded at a time; default the patch size (ViTs) or 1/8 of the image.
            For clips (t, h, w): default one token's tubelet, its T / T' frames x the patch;
            an int or (h, w) sets the space part, t staying the tubelet.
        stride: default the window (non-overlapping); at most the window. For clips (t, h, w);
            an int or (h, w) sets the space part, t staying the window's.
        baseline: the value an occluded window is set to, in the model's normalized space.
        max_bytes: the most one forward of occluded images (clips) may hold (default: as much
            as a forward of the batch; `vizkit.hooks.passes`).
    """
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    per_pass = images_per_pass(hm.model, x, max_bytes, False, "occlusion")
    baseline = check_number("baseline", baseline)
    size = tuple(x.shape[-2:]) if x.ndim == 4 else (x.shape[1], *x.shape[-2:])  # (T,) H, W
    default = _default_window(hm, x)
    window = _checked_window("window", window, default, size)
    stride = _checked_window("stride", stride, window, size)
    if any(s > w for s, w in zip(stride, window, strict=True)):
        raise ValueError(
            f"stride {stride} is larger than the window {window}: pixels between windows would "
            f"never be occluded. Pass a stride of at most {window}, or a larger window."
        )
    covers = [_windows(*side, x.device) for side in zip(size, window, stride, strict=True)]
    with torch.no_grad():
        clean, targets = _clean_scores(hm.model, x, target, per_pass)
        drops = clean[:, None] - _occluded_scores(hm.model, x, target, targets, covers, baseline,
                                                  per_pass)  # fmt: skip
    maps = _mean_over_windows(drops, covers)
    check_values_finite("The occlusion maps", maps)
    options = {"window": window, "stride": stride, "baseline": baseline,
               "images_per_pass": per_pass}  # fmt: skip
    return SaliencyResult(maps=maps.float(), method="occlusion", image_size=tuple(x.shape[-2:]),
                          options=options, targets=targets,
                          frames=size[0] if x.ndim == 5 else None)  # fmt: skip


def _default_window(hm: HookedModel, x: Tensor) -> tuple[int, ...]:
    """The window when none is given: for images (B, C, H, W) a timm ViT's patch, else 1/8 of
    the image; for clips (B, T, C, H, W) one token, (T / T', H / gh, W / gw) (1/8 of the frame
    where the model has no patch grid)."""
    image_size = tuple(x.shape[-2:])
    if x.ndim == 5:
        layout = hm.token_layout(image_size)
        patch = (
            tuple(s // 8 for s in image_size)
            if layout is None
            else tuple(s // g for s, g in zip(image_size, layout.grid, strict=True))
        )
        return (video_input(hm.model).tubelet, *patch)
    pe = getattr(hm.model, "patch_embed", None)
    return tuple(pe.patch_size) if pe is not None else tuple(s // 8 for s in image_size)


def _checked_window(
    name: str, value: Window | None, default: tuple[int, ...], size: tuple[int, ...]
) -> tuple[int, ...]:
    """``value`` (None: ``default``) as an (h, w) window in the image ``size`` (H, W), or for a
    clip's ``size`` (T, H, W) a (t, h, w) one: an int or (h, w) there sets the space part, t
    taken from ``default``."""
    value = default if value is None else value
    if len(size) == 2:
        return check_size(name, value, size)
    if not (isinstance(value, (tuple, list)) and len(value) == 3):
        return (default[0], *check_size(name, value, size[1:]))
    t = value[0]
    valid = (
        f"(t, h, w) with t an int from 1 up to the clip's {size[0]} frames (or an int or (h, w) "
        "for the space part alone)"
    )
    if isinstance(t, bool) or not isinstance(t, numbers.Integral):
        raise TypeError(f"{name} must be {valid}; got {value!r}.")
    if not 1 <= t <= size[0]:
        raise ValueError(f"{name} must be {valid}; got {value!r}.")
    return (int(t), *check_size(name, tuple(value[1:]), size[1:]))


def _windows(size: int, window: int, stride: int, device: torch.device) -> Tensor:
    """(n, size) bool: the pixels (frames) each window covers along one axis, at offsets 0,
    stride, ... (captum's count, ceil((size - window) / stride) + 1), the last cut at the
    edge."""
    starts = torch.arange(math.ceil((size - window) / stride) + 1, device=device) * stride
    pixels = torch.arange(size, device=device)
    return (pixels >= starts[:, None]) & (pixels < starts[:, None] + window)


def _mean_over_windows(drops: Tensor, covers: list[Tensor]) -> Tensor:
    """(B, H, W) (a clip's (B, T, H, W)), float64: each pixel's mean drop over the windows that
    cover it, from ``drops`` (B, windows) in the order of `_occluded_scores` and ``covers``, one
    (n, size) per axis (`_windows`)."""
    total = drops.double().view(len(drops), *(len(c) for c in covers))  # (B, n_t, n_h, n_w)
    count = torch.ones((), dtype=torch.float64, device=drops.device)
    for cover in covers:  # sum out the next window axis; its pixels go last
        total = torch.tensordot(total, cover.double(), dims=([1], [0]))
        count = count[..., None] * cover.double().sum(0)
    return total / count


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
    """(B, windows) the score of each image (clip) with each window set to ``baseline``, the
    windows in raster order over ``covers`` (time, rows, columns), ``per_pass`` occluded images
    per forward."""
    counts = [len(c) for c in covers]
    windows = math.prod(counts)
    scores = torch.empty(len(x) * windows, device=x.device)
    for start in range(0, len(scores), per_pass):
        pair = torch.arange(start, min(start + per_pass, len(scores)), device=x.device)
        image, at = pair // windows, pair % windows
        hidden = _hidden(covers, torch.unravel_index(at, counts))  # (n, H, W) or (n, T, H, W)
        occluded = x[image].masked_fill_(hidden.unsqueeze(-3), baseline)
        scores[pair] = _scores(model(occluded), target, targets, image)
    return scores.view(len(x), windows)


def _hidden(covers: list[Tensor], index: tuple[Tensor, ...]) -> Tensor:
    """(n, *size) bool: the pixels of n windows, window i at position ``index[axis][i]`` along
    each axis of ``covers`` (one (count, size) per axis)."""
    hidden = None
    for axis, (cover, at) in enumerate(zip(covers, index, strict=True)):
        shape = [len(at)] + [1] * len(covers)
        shape[axis + 1] = -1
        part = cover[at].view(shape)
        hidden = part if hidden is None else hidden & part
    return hidden
