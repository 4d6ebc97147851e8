"""Max-sensitivity (Yeh et al. 2019, "On the (In)fidelity and Sensitivity of Explanations",
Sec. 4): how much a saliency method's map changes when the image moves a little, the largest
||Phi(x + delta) - Phi(x)|| over ``samples`` draws of delta uniform in [-radius, radius] per
pixel, relative to ||Phi(x)|| (Frobenius norms, as Quantus' default) so methods of different
scales compare. Lower: a more robust explanation."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images, check_number, check_values_finite
from ..hooks.scores import model_logits, target_indices
from ..methods.registry import registered

__all__ = ["max_sensitivity"]

Explainer = Callable[[nn.Module, Tensor, Tensor], SaliencyResult]


@analysis_contract
def max_sensitivity(
    model: nn.Module | HookedModel, x: Tensor, method: str | Explainer = "gradcam",
    target: Target = None, radius: float = 0.2, samples: int = 10, seed: int = 0,
    **options,
) -> Tensor:  # fmt: skip
    """(B,) max over ``samples`` noisy copies of ||Phi(x + delta) - Phi(x)||_F / ||Phi(x)||_F.

    Args:
        method: a name of `vk.methods.METHODS`, or ``fn(model, x, targets) -> SaliencyResult``.
        target: the classes explained (int, B ints, None: the prediction on x), the same for
            the noisy copies.
        radius: the noise's bound in the images' (normalized) units, > 0; samples: noisy copies
            per image, all explained in one call of the method; seed: the noise's generator.
        options: passed to a named method (e.g. ``layer=``).

    Raises:
        ValueError: a map of x that is all zero (no relative change), a callable target.
    """
    x = check_images(model.model, x)
    radius = check_number("radius", radius, 0, low_open=True)
    samples = check_count("samples", samples)
    seed = check_count("seed", seed, 0)
    if callable(target) and not isinstance(target, Tensor):
        raise TypeError("max_sensitivity explains classes: pass an int, B ints or None.")
    explain = _explainer(method, options)
    with torch.no_grad():
        targets = target_indices(model_logits(model(x)), target)
    original = explain(model.model, x, targets).maps.double()
    generator = torch.Generator().manual_seed(seed)
    noise = (torch.rand((samples, *x.shape), generator=generator, dtype=x.dtype) * 2 - 1) * radius
    noisy = (x[None] + noise.to(x.device)).flatten(0, 1)  # (samples * B, C, H, W)
    maps = explain(model.model, noisy, targets.repeat(samples)).maps.double()
    check_values_finite("The saliency maps", maps)
    change = (maps.view(samples, *original.shape) - original).flatten(2).norm(dim=-1)
    size = original.flatten(1).norm(dim=-1)
    if bool((size == 0).any()):
        raise ValueError(
            f"The maps of samples {(size == 0).nonzero()[:, 0].tolist()[:10]} are all zero, so "
            "a relative change is undefined; drop them or explain another class or layer."
        )
    return (change.amax(0) / size).float()


def _explainer(method: str | Explainer, options: dict) -> Explainer:
    if callable(method):
        return method
    saliency = registered(method)
    return lambda model, x, targets: saliency(model, x, targets, **options)
