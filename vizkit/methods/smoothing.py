"""Any registered method smoothed as SmoothGrad smooths the gradient (Smilkov et al. 2017,
Eq. 3): its maps averaged over ``samples`` copies of the images with Gaussian noise of standard
deviation ``noise`` times the batch's value range."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import as_hooked
from ..hooks.inputs import check_count, check_images, check_number
from .registry import methods

__all__ = ["smoothed"]


def smoothed(
    method: str, model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    samples: int = 16, noise: float = 0.15, seed: int = 0, **options,
) -> SaliencyResult:  # fmt: skip
    """The registered ``method``'s maps (B, h, w) averaged over ``samples`` noisy copies of
    ``x`` (one call of the method per copy of the batch; ``options`` go to the method), e.g.
    ``smoothed("gradcam_pp", model, x, target=3)``.

    Raises:
        KeyError: an unregistered method name.
    """
    registered = methods()
    if method not in registered:
        raise KeyError(f"Unknown saliency method {method!r}; known: {', '.join(registered)}.")
    samples = check_count("samples", samples)
    noise = check_number("noise", noise, 0.0)
    hm = as_hooked(model)
    x = check_images(hm.model, x)
    generator = torch.Generator(device=x.device).manual_seed(check_count("seed", seed, 0))
    scale = noise * (x.max() - x.min())
    total, first = None, None
    for _ in range(samples):
        noisy = x + scale * torch.randn(x.shape, generator=generator, device=x.device)
        result = registered[method](hm, noisy, target, **options)
        first = first or result
        total = result.maps if total is None else total + result.maps
    return SaliencyResult(
        maps=total / samples,
        method=f"{method} (smoothed)",
        image_size=first.image_size,
        options={**first.options, "samples": samples, "noise": noise, "seed": seed},
        layout=first.layout,
        targets=first.targets,
    )
