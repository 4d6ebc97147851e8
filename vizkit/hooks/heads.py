"""Choosing heads: ``heads=`` reduces the head axis of a map with ``"mean"``, ``"max"`` or
``"min"``, keeps one head (an int, negative from the end), or averages the listed heads (a list
of ints).

Example:
    >>> import torch
    >>> pattern = torch.arange(6.0).view(1, 3, 2)  # (B, H, N)
    >>> reduce_heads(pattern, "max", head_dim=1), reduce_heads(pattern, [0, 2], head_dim=1)
    (tensor([[4., 5.]]), tensor([[2., 3.]]))
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["HeadSpec", "head_option", "reduce_heads"]

HeadSpec = str | int | Sequence[int]

HEAD_REDUCTIONS = ("mean", "max", "min")


def head_option(heads: HeadSpec) -> str | int | list[int]:
    """``heads`` as stored in a result's options: a reduction name, an int or a list of ints."""
    if isinstance(heads, (list, tuple, range)):
        return [int(h) for h in heads]
    return int(heads) if isinstance(heads, numbers.Integral) else heads


def reduce_heads(
    pattern: Tensor, heads: HeadSpec = "mean", head_dim: int = -3, dtype: torch.dtype | None = None
) -> Tensor:
    """Fuse the head axis ``head_dim`` of ``pattern``: ``"mean"``, ``"max"``, ``"min"``, one
    head (an int, negative from the end) or the mean of the listed heads (a list of ints).
    ``dtype``: the result's; a mean in another dtype adds the heads one at a time, so at most
    one head's map is held in it besides the result (``mean(dtype=)`` converts every head)."""
    if isinstance(heads, str):
        if heads == "mean":
            return _mean_of_heads(pattern, range(pattern.shape[head_dim]), head_dim, dtype)
        if heads in ("max", "min"):
            return getattr(pattern, heads)(head_dim).values.to(dtype or pattern.dtype)
    elif isinstance(heads, numbers.Integral) and not isinstance(heads, bool):
        (head,) = _head_indices([heads], pattern.shape[head_dim])
        return pattern.select(head_dim, head).to(dtype or pattern.dtype)
    elif isinstance(heads, (list, tuple, range)) and len(heads):
        chosen = _head_indices(heads, pattern.shape[head_dim])
        return _mean_of_heads(pattern, chosen, head_dim, dtype)
    raise ValueError(
        f"heads must be 'mean', 'max', 'min', a head index or a non-empty list of head indices; "
        f"got {heads!r}."
    )


def _mean_of_heads(pattern: Tensor, heads, head_dim: int, dtype: torch.dtype | None) -> Tensor:
    """Mean of the maps ``heads`` along ``head_dim`` (all of them in order: the plain mean)."""
    if dtype is None or dtype == pattern.dtype:
        if len(heads) == pattern.shape[head_dim]:
            return pattern.mean(head_dim)
        index = torch.tensor(list(heads), device=pattern.device)
        return pattern.index_select(head_dim, index).mean(head_dim)
    total = pattern.select(head_dim, heads[0]).to(dtype, copy=True)
    for head in heads[1:]:
        total.add_(pattern.select(head_dim, head).to(dtype))
    return total.div_(len(heads))


def _head_indices(heads: Sequence[int], count: int) -> list[int]:
    """``heads`` as indices in [0, count), negative from the end; a ValueError naming the map's
    head count (stages of a hierarchical model differ)."""
    chosen = []
    for head in heads:
        if isinstance(head, bool) or not isinstance(head, numbers.Integral):
            raise ValueError(f"heads must hold head indices (ints); got {head!r}.")
        if not -count <= head < count:
            raise ValueError(
                f"heads: head {head} does not exist in a map with {count} heads (valid: "
                f"0..{count - 1} or -{count}..-1; the stages of a hierarchical model have "
                "different head counts)."
            )
        chosen.append(int(head) % count)
    return chosen
