"""The chance level: uniform noise maps, which every saliency method should beat."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..analysis.saliency_result import SaliencyResult
from ..hooks import HookedModel, Target
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count, check_images
from ..hooks.scores import call_target, explained_classes, is_score_target
from .registry import saliency_method

__all__ = ["random_saliency"]


@saliency_method(
    "random", summary="uniform noise: the chance level every method should beat", default=True,
)  # fmt: skip
@analysis_contract(videos=True)
def random_saliency(
    model: nn.Module | HookedModel, x: Tensor, target: Target = None, seed: int = 0
) -> SaliencyResult:
    """Uniform noise maps (B, H, W) for images x (B, C, H, W), (B, T, H, W) for a video
    model's clips x (B, T, C, H, W): the chance level every method should beat. ``target``
    is only recorded (validated against the model's logits); ``seed`` is an int in
    [0, 2**64 - 1]."""
    x = check_images(model.model, x)
    seed = check_count("seed", seed, 0, 2**64 - 1)
    targets = None
    if target is not None:
        with torch.no_grad():
            output = model.model(x)
        if is_score_target(target):  # checked as the other methods check it
            call_target(target, output, None, len(x))
        targets = explained_classes(output, target)
    generator = torch.Generator().manual_seed(seed)
    shape = (*x.shape[:-3], *x.shape[-2:])  # the input's without channels: (B, [T,] H, W)
    maps = torch.rand(shape, generator=generator).to(x.device)
    frames = x.shape[1] if x.ndim == 5 else None
    return SaliencyResult(maps, "random", tuple(x.shape[-2:]), {"seed": seed}, targets=targets,
                          frames=frames)  # fmt: skip
