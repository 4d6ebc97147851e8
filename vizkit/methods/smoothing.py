"""Any registered method smoothed as SmoothGrad smooths the gradient (Smilkov et al. 2017,
Eq. 3): its maps averaged over ``samples`` copies of each image with Gaussian noise of
standard deviation ``noise`` times the batch's value range, each copy's noise drawn as
`vk.smoothgrad` draws it (`noisy_copies`), the copies run in passes sized by ``max_bytes``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images
from ..hooks.passes import images_per_pass
from ..hooks.scores import is_score_target, model_logits, select_images, target_indices
from .noisy_copies import mean_over_copies, noise_deviation, noisy_copies
from .registry import SaliencyMethod, registered

__all__ = ["smoothed"]


def smoothed(
    method: str, model: nn.Module | HookedModel, x: Tensor, target: Target = None,
    samples: int = 16, noise: float = 0.15, seed: int = 0, max_bytes: int | None = None,
    **options,
) -> SaliencyResult:  # fmt: skip
    """The registered ``method``'s maps (B, h, w) averaged over ``samples`` noisy copies of
    each image of ``x``, e.g. ``smoothed("gradcam_pp", model, x, target=3)``: every copy
    explains its image's class (``target``, or None: the prediction on the clean image) or
    score target; ``options`` go to the method; ``noise`` 0 gives the method itself.
    ``max_bytes``: the most one pass of copies may hold (default: as much as one pass of the
    batch, with gradients where the method takes them).

    Raises:
        KeyError: an unregistered method name.
    """
    chosen = registered(method)
    return _smoothed(model, x, chosen, target, samples, noise, seed, max_bytes, options)


@analysis_contract
def _smoothed(
    model: HookedModel, x: Tensor, method: SaliencyMethod, target: Target, samples: int,
    noise: float, seed: int, max_bytes: int | None, options: dict,
) -> SaliencyResult:  # fmt: skip
    samples = check_count("samples", samples)
    seed = check_count("seed", seed, 0)
    x = check_images(model.model, x)
    stdev = noise_deviation(x, noise)
    if not is_score_target(target):
        with torch.no_grad():
            target = target_indices(model_logits(model(x)), target)
    gradients = "gradients" in method.needs
    per_pass = images_per_pass(model.model, x, max_bytes, gradients, f"smoothed {method.name}")
    first: list[SaliencyResult] = []

    def maps(rows: Tensor, generators: list[torch.Generator]) -> Tensor:
        copies = noisy_copies(x, rows, generators, stdev).to(x.dtype)
        classes = select_images(target, rows) if is_score_target(target) else target[rows]
        result = method(model, copies, classes, **options)
        if not first:
            first.append(result)
        return result.maps

    total = mean_over_copies(x, samples, per_pass, seed, maps)
    return SaliencyResult(
        maps=total,
        method=f"{method.name} (smoothed)",
        image_size=first[0].image_size,
        options={
            **first[0].options,
            "samples": samples,
            "noise": noise,
            "seed": seed,
            "images_per_pass": per_pass,
        },  # fmt: skip
        layout=first[0].layout,
        targets=None if is_score_target(target) else target,
    )
