"""The saliency methods as the report runs them, in the saliency and evaluation sections: the
registry's defaults, integrated gradients of `IG_STEPS` steps, and integrated gradients and
AttnLRP in passes of at most `PASS_BYTES` (the memory rule of `vizkit.hooks.passes`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from ...analysis import SaliencyResult
from ...hooks import HookedModel, Target
from ...hooks.contract import as_hooked
from ...hooks.passes import images_per_pass, one_image_bytes
from ...hooks.scores import select_images
from ...methods.attnlrp import attnlrp
from ...methods.integrated_gradients import integrated_gradients
from ...methods.registry import default_methods

__all__ = ["IG_STEPS", "PASS_BYTES", "attnlrp_in_passes", "pass_bytes", "report_methods"]

# with the saliency section's CURVE_STEPS, the comparison's quick settings: on the trained Shapes
# ViT's 16 sample images they move a method's mean AUC by at most 0.012 from 16 curve steps and
# 50 integrated-gradients steps; two methods 0.007 apart swap places
# (python benchmarks/report_settings.py)
IG_STEPS = 16
# the most one forward and backward pass of the report's integrated gradients or AttnLRP holds,
# or one image's pass where that is more (`pass_bytes`); tensor bytes by
# `vizkit.hooks.passes.peak_bytes`, resident peaks by python benchmarks/report.py. On the
# default report (vit_tiny_shapes, 8 Shapes images, 1.4 MiB an image's pass) an integrated-
# gradients pass holds 11 images, 11.5 MiB, and AttnLRP's all 8, 13.5 MiB: under the 19.4 MiB
# the saliency section holds with or without them; the report's peak stays 0.93-0.94 GB
# (passes of 80 MiB, two ViT-S images, made it 1.03 GB). On ViT-S (deit_small_patch16_224,
# 37.9 MiB an image) a pass is one image, 47 MiB for AttnLRP, under the attention section's
# 171 MiB, which sets that report's peak (1.18-1.20 GB, before and after passes by bytes).
PASS_BYTES = 16 * 2**20


def report_methods(has_attention: bool) -> list[str | tuple]:
    """The default methods as the report runs them: by name, but integrated gradients (of
    `IG_STEPS` steps) and AttnLRP as (name, fn(hm, x, targets)) pairs whose forward and
    backward passes hold at most `pass_bytes`."""
    budgeted = {
        "integrated_gradients": lambda hm, x, targets: integrated_gradients(
            hm, x, targets, n_steps=IG_STEPS, max_bytes=pass_bytes(hm, x)
        ),
        "attnlrp": lambda hm, x, targets: attnlrp_in_passes(hm, x, targets, pass_bytes(hm, x)),
    }
    return [(n, budgeted[n]) if n in budgeted else n for n in default_methods(has_attention)]


def pass_bytes(model: nn.Module | HookedModel, x: Tensor) -> int:
    """The most one forward and backward pass of the report's methods on the images x
    (B, C, H, W) may hold: `PASS_BYTES`, or one image's pass (`one_image_bytes`) where that
    holds more (a larger model than ViT-S)."""
    return max(PASS_BYTES, one_image_bytes(as_hooked(model).model, x, gradients=True))


def attnlrp_in_passes(
    model: nn.Module | HookedModel, x: Tensor, target: Target, max_bytes: int
) -> SaliencyResult:
    """`attnlrp` of the images x (B, C, H, W) in backward passes of as many images as
    ``max_bytes`` holds (`images_per_pass`); `attnlrp` has no byte budget of its own and runs
    the whole batch in one pass. An image's map is its own, so the result is the one pass's:
    maps (B, H, W), targets (B,) and ``extras["relevance"]`` (B, C, H, W)."""
    hm = as_hooked(model)
    per_pass = images_per_pass(hm.model, x, max_bytes, True, "attnlrp")
    passes = torch.arange(len(x), device=x.device).split(per_pass)
    return _joined([attnlrp(hm, x[rows], _target_for(target, rows)) for rows in passes])


def _target_for(target: Target, rows: Tensor) -> Target:
    """``target`` for the images ``rows`` (m,) of its batch: a tensor's rows (B,) -> (m,), a
    score target's for those images (`select_images`), anything else as it is."""
    if isinstance(target, Tensor) and target.ndim:
        return target[rows.to(target.device)]
    return select_images(target, rows)


def _joined(parts: list[SaliencyResult]) -> SaliencyResult:
    """The results of consecutive slices of a batch as one: maps, targets and extras
    concatenated (the first slice's options and layout)."""
    first = parts[0]
    targets = None if first.targets is None else torch.cat([p.targets for p in parts])
    extras = {key: torch.cat([p.extras[key] for p in parts]) for key in first.extras}
    maps = torch.cat([p.maps for p in parts])
    return dataclasses.replace(first, maps=maps, targets=targets, extras=extras)
