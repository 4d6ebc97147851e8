"""Targets for gradients: which logit (or callable score) to differentiate."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["Target", "explained_classes", "target_indices", "target_score"]

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
        return score.sum()
    return output.gather(1, target_indices(output, target)[:, None]).sum()


def explained_classes(output: Tensor, target: Target) -> Tensor | None:
    """(B,) class index each sample's score refers to; None for a callable target."""
    if callable(target) and not isinstance(target, Tensor):
        return None
    return target_indices(output, target)


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
    if isinstance(target, (bool, str)) or not isinstance(target, (int, Sequence, Tensor)):
        raise TypeError(f"target must be an int, B ints, a callable or None; got {target!r}.")
    index = torch.as_tensor(target, device=output.device).long().reshape(-1)
    if index.numel() == 1:
        index = index.expand(batch)
    if index.numel() != batch:
        raise ValueError(
            f"Got {index.numel()} targets for a batch of {batch}; give one int "
            "for all samples or one per sample."
        )
    bad = index[(index < 0) | (index >= classes)]
    if bad.numel():
        raise ValueError(
            f"Target class {bad[0].item()} is out of range: the model has "
            f"{classes} classes (valid: 0..{classes - 1})."
        )
    return index
