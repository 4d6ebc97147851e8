"""What Score-CAM and Ablation-CAM share: the target score of many perturbed forwards, run in
chunks on the model's device with autograd off; and the forward from a block on, which spares
Ablation-CAM the blocks before its layer."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..hooks import HookedModel, Target
from ..hooks.scores import call_target, is_score_target, model_logits, output_rows, target_indices

__all__ = ["chunked_scores", "resumed_forward", "score_of"]


def score_of(logits: Tensor, target: Target, image: int) -> Callable[[object], Tensor]:
    """``output -> (N,)``: the score image ``image``'s map explains, for N perturbed copies of
    it: its class logit (``target`` an int, B ints or None for the argmax of ``logits``), or
    the callable target's value per copy."""
    if is_score_target(target):
        return lambda output: call_target(target, output, image, output_rows(output))
    index = int(target_indices(logits, target)[image])
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


def resumed_forward(
    hm: HookedModel, name: str, activation: Tensor, output: object
) -> Callable[[Tensor], Tensor] | None:
    """``activation -> logits``: the model's forward from the activation ``name`` on, where
    ``name`` is a block's input or output (``hook_resid_pre`` / ``hook_resid_post``): the
    blocks after it in order, then the family's head on the last one
    (`FamilyLayout.readout`). Given only where it reproduces the model's ``output`` from
    ``activation`` (the value ``name`` took in that forward); None elsewhere (no readout,
    blocks that take more than the tokens, stages joined by other modules, a wrapper's
    head)."""
    family = hm.family
    if family is None or family.readout is None:
        return None
    paths = [block.path for block in family.blocks]
    starts = {f"{p}.hook_resid_pre": i for i, p in enumerate(paths)}
    starts |= {f"{p}.hook_resid_post": i + 1 for i, p in enumerate(paths)}
    if name not in starts:
        return None
    blocks = [hm.model.get_submodule(p) for p in paths[starts[name] :]]

    def forward(tokens: Tensor) -> Tensor:
        for block in blocks:
            tokens = block(tokens)
        return family.readout(tokens)

    logits = model_logits(output)
    try:
        with torch.no_grad():
            resumed = forward(activation)
    except (TypeError, ValueError, RuntimeError):  # a block that needs more than the tokens
        return None
    same = isinstance(logits, Tensor) and resumed.shape == logits.shape
    if not same or not torch.allclose(resumed.float(), logits.float(), rtol=1e-4, atol=1e-5):
        return None
    return forward
