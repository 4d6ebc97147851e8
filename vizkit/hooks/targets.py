"""Targets for gradients: which logit (or callable score) to differentiate."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Target",
    "class_indices",
    "explained_classes",
    "model_logits",
    "target_indices",
    "target_score",
]

Target = int | Sequence[int] | Tensor | Callable[[Tensor], Tensor] | None


def target_score(output: Tensor, target: Target) -> Tensor:
    """The scalar whose gradient is taken: the sum over the batch of each sample's target logit.

    Args:
        output: model output, (B, K) logits for int targets.
        target: a class index for every sample; a list/tensor of B class indices (one per
            sample); a callable ``output -> Tensor`` (summed); None: each sample's argmax.

    Returns:
        A scalar tensor.
    """
    if callable(target) and not isinstance(target, Tensor):
        score = target(output)
        if not isinstance(score, Tensor):
            raise TypeError(f"A callable target must return a tensor; got {type(score).__name__}.")
    else:
        logits = model_logits(output)
        index = target_indices(logits, target)  # checks that output is (B, K) logits
        score = logits.gather(1, index[:, None])
    if not bool(torch.isfinite(score).all()):
        raise ValueError(
            "The target score is NaN or Inf, so its gradient means nothing: the model's output "
            "(or the callable target) is not finite on this batch. Check the weights and the "
            "input's normalization (float16 overflow?)."
        )
    return score.sum()


def model_logits(output: object) -> object:
    """The logits of a model output: the output itself, or the ``logits`` of a structured one
    (a transformers ``ModelOutput``, a dict); other outputs are returned as they are."""
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    return logits if isinstance(logits, Tensor) else output


def explained_classes(output: Tensor, target: Target) -> Tensor | None:
    """(B,) class index each sample's score refers to; None for a callable target."""
    if callable(target) and not isinstance(target, Tensor):
        return None
    return target_indices(model_logits(output), target)


def target_indices(output: Tensor, target: Target) -> Tensor:
    """(B,) class indices for ``target`` (an int, B ints, or None for the argmax), validated
    against the (B, K) logits ``output``."""
    if not isinstance(output, Tensor) or output.ndim != 2:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(
            f"Class-index targets need (B, num_classes) logits; the model returned "
            f"{shape}. Pass a callable target, e.g. target=lambda out: out[..., 0]."
        )
    batch, classes = output.shape
    if target is None:
        return output.argmax(dim=-1)
    index = class_indices(target, batch).to(output.device)
    bad = index[(index < 0) | (index >= classes)]
    if bad.numel():
        raise ValueError(
            f"Target class {bad[0].item()} is out of range: the model has "
            f"{classes} classes (valid: 0..{classes - 1})."
        )
    return index


def class_indices(target: Target, batch: int) -> Tensor:
    """(B,) int64 class indices from an int (numpy integers too) for every sample, or B of them
    (a list, tuple, integer tensor or array). Float, bool and str targets are refused: a class
    index is never rounded."""
    valid = "an int class index, B of them (list, tuple, integer tensor or array), a callable on "
    valid += "the output, or None for each sample's argmax"
    if isinstance(target, np.ndarray) or isinstance(target, np.generic):
        target = torch.from_numpy(np.asarray(target))
    if isinstance(target, Tensor):
        if target.ndim == 2 and target.shape[-1] > 1:
            raise ValueError(
                f"target must be {valid}; got a {tuple(target.shape)} tensor, one row of "
                "scores per sample (one-hot labels or probabilities?). Pass the class "
                "indices: target.argmax(dim=1)."
            )
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TypeError(
                f"target must be {valid}; got a {target.dtype} tensor. Class indices are "
                "integers: pass target.long() if the values are whole numbers."
            )
        index = target.reshape(-1).long()
    elif isinstance(target, numbers.Integral) and not isinstance(target, bool):
        index = torch.tensor([int(target)])
    elif isinstance(target, Sequence) and not isinstance(target, str):
        wrong = [t for t in target if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if wrong:
            raise TypeError(f"target must be {valid}; got {wrong[0]!r} in {list(target)!r}.")
        index = torch.tensor([int(t) for t in target], dtype=torch.long)
    else:
        raise TypeError(f"target must be {valid}; got {target!r} ({type(target).__name__}).")
    if index.numel() == 1:
        return index.expand(batch)
    if index.numel() != batch:
        raise ValueError(
            f"Got {index.numel()} targets for a batch of {batch}; give one int "
            "for all samples or one per sample."
        )
    return index
