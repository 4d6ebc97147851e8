"""How a tap's value is read from its module: one small class per way, each attaching its hooks
with ``attach(module, emit)``; ``on_path`` says whether the forward goes on with the value read
(a gradient can be taken there). ``emit(raw)`` hands the value to the call (its functions run
on it, it is recorded) and returns the tensor the forward goes on with; a value computed beside
the forward is emitted with ``derived=True`` and cannot be replaced.

- `OutputReader`: the module's output, or one item of a tuple output (MViTv2's blocks).
- `InputReader`: one positional input of the module.
- `ComputedReader`: a value derived when the module runs (a position bias, a map recomputed
  from the module's input), read only.
- `BesideReader`: an attention map computed beside a fused kernel (`vizkit.hooks.beside`).

A module that runs several times per forward (CaiT's shared ``drop_path``) is read at one of its
calls: `NthCall` counts them, from 0 each time its scope module starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .taps import Compute, Tap

__all__ = [
    "BesideReader",
    "ComputedReader",
    "Emit",
    "InputReader",
    "NthCall",
    "OutputReader",
    "reader_for",
]

Emit = Callable[..., Tensor]  # emit(raw, derived=False) -> the tensor the forward goes on with


class NthCall:
    """Whether this call of a module is the ``call``-th (0-based) since its ``scope`` module
    started (``call`` None: every call)."""

    def __init__(self, call: int | None = None, scope: nn.Module | None = None) -> None:
        self.call, self.scope, self.seen = call, scope, 0

    def __call__(self) -> bool:
        if self.call is None:
            return True
        self.seen += 1
        return self.seen - 1 == self.call

    def attach(self) -> list[RemovableHandle]:
        """The hook that counts from 0 each time the scope runs (none for every call)."""
        if self.call is None:
            return []

        def reset(module: nn.Module, args: tuple) -> None:
            self.seen = 0

        return [self.scope.register_forward_pre_hook(reset)]


@dataclass
class OutputReader:
    """The module's output (``item``: one item of a tuple output), at the calls ``selected``."""

    item: int | None = None
    selected: NthCall = field(default_factory=NthCall)

    on_path = True  # the forward goes on with the value read

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        def forward_hook(mod: nn.Module, args: tuple, output: Any) -> Any:
            if not self.selected():
                return None
            raw = output if self.item is None else output[self.item]
            used = emit(raw)
            if used is raw:
                return None
            if self.item is None:
                return used
            items = list(output)
            items[self.item] = used
            return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)

        return [module.register_forward_hook(forward_hook), *self.selected.attach()]


@dataclass
class InputReader:
    """Positional input ``arg`` of the module at ``path`` (the tap ``name``'s; for messages),
    at the calls ``selected``."""

    arg: int
    name: str
    path: str
    selected: NthCall = field(default_factory=NthCall)

    on_path = True  # the forward goes on with the value read

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        def pre_hook(mod: nn.Module, args: tuple) -> tuple | None:
            if not self.selected():
                return None
            if len(args) <= self.arg:
                raise TypeError(
                    f"{self.name}: {self.path} was called with {len(args)} positional "
                    f"inputs; vizkit reads positional input {self.arg}."
                )
            used = emit(args[self.arg])
            if used is args[self.arg]:
                return None
            return (*args[: self.arg], used, *args[self.arg + 1 :])

        return [module.register_forward_pre_hook(pre_hook), *self.selected.attach()]


@dataclass
class ComputedReader:
    """``compute(module, args, kwargs, output)`` each time the module runs, read only."""

    compute: Compute

    on_path = False  # computed beside the forward

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        def derived_hook(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            emit(self.compute(mod, args, kwargs, output), derived=True)

        return [module.register_forward_hook(derived_hook, with_kwargs=True)]


@dataclass
class BesideReader:
    """An attention map computed beside the module's fused kernel: ``beside(on_map)`` attaches
    the hooks (on the module's own submodules) and returns their handles."""

    beside: Callable[[Callable[[Tensor], None]], list]

    on_path = False  # computed beside the forward

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        return self.beside(lambda pattern: emit(pattern, derived=True))


def reader_for(
    tap: Tap, beside: bool, modules: dict[str, nn.Module]
) -> OutputReader | InputReader | ComputedReader | BesideReader:
    """The reader of ``tap`` in a call (``beside``: its map is computed beside the fused
    kernel in this call); ``modules``: the model's modules by path."""
    if beside:
        return BesideReader(tap.beside)
    if tap.compute is not None:
        return ComputedReader(tap.compute)
    selected = NthCall(tap.call, None if tap.call is None else modules[tap.call_scope])
    if tap.site == "output":
        return OutputReader(tap.item, selected)
    return InputReader(tap.arg, tap.name, tap.module, selected)
