"""What Score-CAM and Ablation-CAM share: the target score of many perturbed forwards, run in
chunks on the model's device with autograd off."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..hooks import Target
from ..hooks.scores import call_target, is_score_target, model_logits, output_rows, target_indices

__all__ = ["chunked_scores", "score_of"]


def score_of(logits: object, target: Target, image: int) -> Callable[[object], Tensor]:
    """``output -> (N,)``: the score image ``image``'s map explains, for N perturbed copies of
    it: its class logit (``target`` an int, B ints or None for the argmax of ``logits``, the
    model's output on the batch), or the callable target's value per copy."""
    if is_score_target(target):
        return lambda output: call_target(target, output, image, output_rows(output))
    index = int(target_indices(model_logits(logits), target)[image])
    return lambda output: model_logits(output)[:, index]


def chunked_scores(
    forward: Callable[[Tensor], object], make: Callable[[int, int], Tensor], count: int,
    chunk: int, score: Callable[[object], Tensor],
) -> Tensor:  # fmt: skip
    """(count,) scores of ``forward`` on the inputs ``make(start, stop)`` builds, ``chunk`` at
    a time."""
    parts = []
    with torch.no_grad():
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            parts.append(score(forward(make(start, stop))).float())
    return torch.cat(parts)
