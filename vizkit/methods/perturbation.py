"""What Score-CAM and Ablation-CAM share: the target score of many perturbed forwards, run in
chunks on the model's device with autograd off."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..hooks import HookedModel, Target
from ..hooks.targets import model_logits, target_indices

__all__ = ["chunked_scores", "score_of"]


def score_of(logits: Tensor, target: Target, image: int) -> Callable[[object], Tensor]:
    """``output -> (N,)``: the score image ``image``'s map explains, for N perturbed copies of
    it: its class logit (``target`` an int, B ints or None for the argmax of ``logits``), or
    the callable target's value per copy."""
    if callable(target) and not isinstance(target, Tensor):

        def called(output: object) -> Tensor:
            score = target(output)
            if not isinstance(score, Tensor) or score.ndim != 1:
                raise ValueError(
                    "Score-CAM and Ablation-CAM need a callable target that gives one score per "
                    f"image, shape (N,); got {getattr(score, 'shape', type(score).__name__)}."
                )
            return score

        return called
    index = int(target_indices(logits, target)[image])
    return lambda output: model_logits(output)[:, index]


def chunked_scores(
    hm: HookedModel, make: Callable[[int, int], Tensor], count: int, chunk: int,
    score: Callable[[object], Tensor],
) -> Tensor:  # fmt: skip
    """(count,) scores of the inputs ``make(start, stop)`` builds, ``chunk`` at a time."""
    parts = []
    with torch.no_grad():
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            parts.append(score(hm(make(start, stop))).float())
    return torch.cat(parts)
