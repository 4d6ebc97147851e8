"""The user's forward functions on one activation: each sees the value in its canonical layout
and may return a replacement, which is checked (shape, dtype, device) and refused where it
could change nothing (a derived value, a value the module has already used) or where the call
is read-only."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .request import Request
from .taps import Tap

__all__ = ["check_replacement", "edited"]


def edited(tap: Tap, request: Request, raw: Tensor, derived: bool) -> tuple[Tensor, Tensor]:
    """(the value in ``tap``'s canonical layout after the request's functions, the tensor in
    the module's layout the forward goes on with: ``raw`` itself when nothing replaced it).
    ``derived``: a value computed beside the forward, which no function may replace."""
    value = canonical = tap.to_canonical(raw)
    fixed = derived or tap.read_only  # no replacement can change what the model computes
    for fn in request.fwd.get(tap.name, ()):
        new = fn(value, name=tap.name)
        if new is not None and (fixed or request.read_only):
            if isinstance(new, Tensor) and torch.equal(new, value):
                continue  # an unchanged copy edits nothing
            raise ValueError(_edit_refused(tap, derived=fixed and not request.read_only))
        if new is not None:
            check_replacement(tap.name, new, value)
            value = new
    return value, raw if value is canonical else tap.from_canonical(value, raw)


def check_replacement(name: str, new: Any, value: Tensor) -> None:
    """Raise unless the hook's return ``new`` can stand in for ``value``: a tensor of its shape,
    dtype and device (the forward would fail deep inside torch, or silently change precision)."""
    if not isinstance(new, Tensor) or new.shape != value.shape:
        got = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
        raise ValueError(
            f"The hook on {name} returned {got}; a replacement must be a tensor of "
            f"the activation's shape {tuple(value.shape)} (or None to keep it)."
        )
    if new.dtype != value.dtype or new.device != value.device:
        raise TypeError(
            f"The hook on {name} returned a {new.dtype} tensor on {new.device}; the activation "
            f"is {value.dtype} on {value.device}. Cast it back, e.g. .to({value.dtype}, "
            f"'{value.device}'), or return None to keep the activation."
        )


def _edit_refused(tap: Tap, derived: bool) -> str:
    """Why a hook may not replace ``tap``'s value: a derived value, or a read-only run."""
    if derived and tap.compute is None:
        return (
            f"The hook on {tap.name} returned a changed tensor, but {tap.module} returns "
            f"{tap.name} beside an output it has already computed from it, so the edit would "
            "change nothing; return None (read it), or edit the module's input or output instead."
        )
    if derived:
        return (
            f"The hook on {tap.name} returned a changed tensor, but {tap.name} is derived from "
            f"{tap.module}'s weights and input, not passed on by the forward, so the edit would "
            "change nothing; return None (read it), or edit the module's input or output instead."
        )
    return (
        f"The hook on {tap.name} returned a changed tensor in a read-only run "
        "(hooks(read_only=True)); return None, or open hooks() without read_only to edit."
    )
