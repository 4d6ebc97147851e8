"""Warnings raised where the user's code called the hook core, and the one about a model left
in training mode."""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

from torch import nn

__all__ = ["training_effects", "warn_caller", "warn_if_random"]

_INSIDE = (str(Path(__file__).parent), str(Path(contextlib.__file__)))


def warn_caller(message: str) -> None:
    """``warnings.warn(message)`` attributed to the first frame outside the hook core (and
    `contextlib`, which the ``with`` statements of ``hooks()`` pass through): the line that
    called ``run_with_cache`` or opened ``hooks()``."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def warn_if_random(model: nn.Module) -> bool:
    """Warn if the model's training mode makes results random or updates buffers; whether it
    warned."""
    stochastic = training_effects(model) if model.training else []
    if stochastic:
        warn_caller(
            f"{type(model).__name__} is in training mode, so {', '.join(stochastic)} "
            "act in this forward: activations and gradients are random or depend on the "
            "batch. Call model.eval() first, or use the vizkit analyses, which run the model "
            "in eval mode and restore its mode after."
        )
    return bool(stochastic)


def training_effects(model: nn.Module) -> list[str]:
    """What train mode changes in ``model``'s forward: active dropout or drop-path (random
    outputs) and BatchNorm (batch statistics, running statistics updated)."""
    kinds = {}
    for module in model.modules():
        if not module.training:
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            kinds["dropout"] = True
        elif getattr(module, "drop_prob", 0) > 0:  # timm DropPath, DropBlock
            kinds["drop-path"] = True
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            kinds["BatchNorm"] = True
    return list(kinds)
