"""The user's forward functions on one activation: each sees the value in its canonical layout
and may return a replacement, which is checked (shape, dtype, device) and refused where it
could change nothing (a derived value, a value the module has already used) or where the call
is read-only."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .readers import Reader
from .request import Request
from .taps import Tap

__all__ = ["check_replacement", "edited"]


def edited(tap: Tap, reader: Reader, request: Request, raw: Tensor) -> tuple[Tensor, Tensor]:
    """(the value in ``tap``'s canonical layout after the request's functions, the tensor in
    the module's layout the forward goes on with: ``raw`` itself when nothing replaced it).
    ``reader``: how the value was read in this call (`Reader.refusal`: no function may replace
    a value whose replacement would change nothing)."""
    value = canonical = tap.to_canonical(raw)
    for fn in request.fwd.get(tap.name, ()):
        new = fn(value, name=tap.name)
        if new is not None and (reader.refusal or request.read_only):
            if isinstance(new, Tensor) and torch.equal(new, value):
                continue  # an unchanged copy edits nothing
            raise ValueError(_edit_refused(tap, None if request.read_only else reader.refusal))
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


def _edit_refused(tap: Tap, refusal: str | None) -> str:
    """Why a hook may not replace ``tap``'s value: its reader's ``refusal`` (the edit would
    change nothing), or (None) a read-only run."""
    if refusal is not None:
        why = refusal.format(name=tap.name, module=tap.module)
        return (
            f"The hook on {tap.name} returned a changed tensor, but {why}, so the edit would "
            "change nothing; return None (read it), or edit the module's input or output instead."
        )
    return (
        f"The hook on {tap.name} returned a changed tensor in a read-only run "
        "(hooks(read_only=True)); return None, or open hooks() without read_only to edit."
    )
