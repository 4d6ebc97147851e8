"""The vocabulary every analysis shares for choosing layers and heads.

``layers=`` (a set of layers) and ``layer=`` (one layer) take

- an int, counting the analysis' own layers in forward order (its self-attention layers for
  `attention`, its blocks' outputs for `cka_matrix`, ...), negative from the end;
- a hook name (``blocks.3.attn.hook_pattern``, negative indices allowed: ``blocks.-1...``), a
  glob (``blocks.1?.attn.hook_pattern``), a compiled regex or a callable on names;
- a module path (``blocks.3``; Swin's stage ``layers.2``): the analysis' layers under it;
- or a list mixing any of these.

``heads=`` reduces the head axis with ``"mean"``, ``"max"`` or ``"min"``, keeps one head (an
int, negative from the end), or averages the listed heads (a list of ints).

Example:
    >>> names = [f"blocks.{i}.attn.hook_pattern" for i in range(4)]
    >>> select_layers([0, -1], names)
    ['blocks.0.attn.hook_pattern', 'blocks.3.attn.hook_pattern']
    >>> select_layers(["blocks.2", "blocks.[12].*"], names)  # each layer once
    ['blocks.2.attn.hook_pattern', 'blocks.1.attn.hook_pattern']
    >>> import torch
    >>> pattern = torch.arange(6.0).view(1, 3, 2)  # (B, H, N)
    >>> reduce_heads(pattern, "max", head_dim=1), reduce_heads(pattern, [0, 2], head_dim=1)
    (tensor([[4., 5.]]), tensor([[2., 3.]]))
"""

from __future__ import annotations

import difflib
import fnmatch
import numbers
import re
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .inputs import check_indices
from .names import GLOB_CHARS, resolve_names, resolve_negative_indices

__all__ = [
    "HeadSpec",
    "LayerSpec",
    "head_option",
    "layer_indices",
    "reduce_heads",
    "select_layer",
    "select_layers",
]

LayerSpec = int | str | re.Pattern | Callable[[str], bool] | Sequence[int | str | re.Pattern]
HeadSpec = str | int | Sequence[int]

HEAD_REDUCTIONS = ("mean", "max", "min")


def select_layers(
    spec: LayerSpec,
    indexed: Sequence[str],
    named: Sequence[str] | None = None,
    *,
    arg: str = "layers",
    what: str = "layers",
) -> list[str]:
    """The hook names ``spec`` selects, each once, in the order given (a glob, regex, callable
    or module path adds its matches in forward order; a name selected twice counts once).

    Args:
        spec: see the module docstring.
        indexed: the analysis' layers in forward order; ints and module paths index these.
        named: the names a hook name or glob may select (default ``indexed``).
        arg, what: the argument's name and what ``indexed`` holds, for error messages.

    Raises:
        TypeError: ``spec`` (or an element of it) is none of the accepted kinds.
        ValueError: an index out of range, or an empty list.
        KeyError: a name that selects nothing.
    """
    named = list(indexed if named is None else named)
    if callable(spec) and not isinstance(spec, re.Pattern):
        return resolve_names(spec, named)
    if isinstance(spec, (str, re.Pattern, numbers.Integral)):
        items = [spec]
    elif isinstance(spec, (list, tuple, range)):
        items = list(spec)
        if not items:
            raise ValueError(f"{arg} is empty; pass None for the default {what} or some of them.")
    else:
        raise TypeError(_type_message(arg, spec, what))
    chosen: list[str] = []
    for item in items:
        if isinstance(item, numbers.Integral) and not isinstance(item, bool):
            chosen += [indexed[i] for i in check_indices(arg, item, len(indexed), what)]
        elif isinstance(item, str):
            chosen += _select_name(item, indexed, named, what)
        elif isinstance(item, re.Pattern):
            chosen += resolve_names(item, named)
        else:
            raise TypeError(_type_message(arg, item, what))
    return list(dict.fromkeys(chosen))


def select_layer(
    spec: LayerSpec,
    indexed: Sequence[str],
    named: Sequence[str] | None = None,
    *,
    arg: str = "layer",
    what: str = "layers",
) -> str:
    """The one hook name ``spec`` selects (as `select_layers`); a ValueError if it selects
    none or several."""
    names = select_layers(spec, indexed, named, arg=arg, what=what)
    if len(names) != 1:
        raise ValueError(
            f"{arg}={spec!r} selects {len(names)} {what} ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}); {arg} takes one: an int, a hook name or a "
            "module path such as 'blocks.3'."
        )
    return names[0]


def layer_indices(names: Sequence[str], indexed: Sequence[str]) -> list[int | None]:
    """Position of each name among ``indexed`` (None for a name outside it)."""
    position = {name: i for i, name in enumerate(indexed)}
    return [position.get(name) for name in names]


def _select_name(item: str, indexed: Sequence[str], named: list[str], what: str) -> list[str]:
    """A hook name or glob over ``named``, else a module path over ``indexed``."""
    if GLOB_CHARS & set(item):
        matched = fnmatch.filter(named, _without_negatives(item, named) or item)
        if matched:
            return matched
        raise KeyError(_unknown(item, item, indexed, named, what))
    resolved = _without_negatives(item, named) or _without_negatives(item, indexed) or item
    if resolved in named:
        return [resolved]
    under = [n for n in indexed if n.startswith(resolved + ".")]
    if under:
        return under
    raise KeyError(_unknown(item, resolved, indexed, named, what))


def _without_negatives(item: str, known: Sequence[str]) -> str | None:
    """``item`` with its negative indices counted back over ``known`` (None where they mean
    nothing there)."""
    try:
        return resolve_negative_indices(item, known)
    except KeyError:
        return None


def _unknown(item: str, resolved: str, indexed: Sequence[str], named: list[str], what: str) -> str:
    shown = f"{item!r}" + (f" ({resolved})" if resolved != item else "")
    close = difflib.get_close_matches(resolved, named, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    others = (
        f", nor another of the {len(named)} hook names it takes (hook_names() lists them)"
        if len(named) > len(indexed)
        else ""
    )
    return (
        f"{shown} matches none of the {len(indexed)} {what} ({_span(list(indexed))}) or a "
        f"module path above them{others}.{hint} Ints count the {what} "
        f"(0..{len(indexed) - 1}, negative from the end)."
    )


def _span(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{names[0]}, ..., {names[-1]}"


def _type_message(arg: str, value: object, what: str) -> str:
    return (
        f"{arg} must be an int (negative from the end), a hook name, a glob, a module path "
        f"such as 'blocks.3', or a list of these; got {value!r} for the {what}."
    )


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
