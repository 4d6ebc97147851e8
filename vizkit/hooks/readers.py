"""How a tap's value is read from its module: one small class per way, each attaching its hooks
with ``attach(module, emit)`` and carrying its own rules for edits and gradients. ``emit(raw)``
hands the value to the call (its functions run on it, it is recorded) and returns the tensor
the forward goes on with.

- `OutputReader`: the module's output, or one item of a tuple output (MViTv2's blocks).
- `InputReader`: one positional input of the module.
- `NthCall`: one call of a module that runs several times per forward (CaiT's shared
  ``drop_path``), read as its inner reader says.
- `ComputedReader`: a value derived when the module runs (a position bias, a map recomputed
  from the module's input), read only.
- `ExplicitPathReader`: an attention map the module materialises only on its explicit path,
  switched on for the call (timm's ``fused_attn`` off, transformers' eager attention, torch's
  ``need_weights``).
- `BesideReader`: an attention map computed beside a fused kernel (`vizkit.hooks.beside`), the
  way a read-only call reads an `ExplicitPathReader` that offers it.

The rules, as class attributes: ``on_path`` (the forward goes on with the value, so a gradient
can be taken there), ``reads_input`` (the value is read before the module runs), ``handed_on``
(the module hands the value on beside an output it has already computed from it: a gradient
must start at the module's input) and ``refusal`` (why replacing the value would change
nothing; None where a hook may replace it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

__all__ = [
    "BesideReader",
    "Compute",
    "ComputedReader",
    "Emit",
    "ExplicitPathReader",
    "InputReader",
    "NthCall",
    "OutputReader",
    "Reader",
]

Emit = Callable[[Any], Any]  # emit(raw) -> the tensor the forward goes on with
Compute = Callable[[nn.Module, tuple, dict, Any], Tensor]  # (module, args, kwargs, output)
Beside = Callable[[Callable[[Tensor], None]], list]  # beside(on_map) -> hook handles


class Reader(ABC):
    """One way of reading a value at a module (the subclasses), with its rules."""

    on_path = True
    reads_input = False
    handed_on = False
    refusal: str | None = None  # "{name}"/"{module}" filled in by the message
    beside: Beside | None = None  # how a read-only call may compute the map instead

    @abstractmethod
    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        """Hooks on ``module`` that call ``emit`` with each value read; their handles."""

    def switched(self) -> AbstractContextManager:
        """The context under which the module materialises the value (entered for the call)."""
        return nullcontext()

    def on_path_of(self, value: Tensor) -> Tensor:
        """The tensor whose gradient is ``value``'s: for a value handed on as a view of the
        tensor the module used (torch's weights, (B·H, L, S) viewed as (B, H, L, S)), its
        base."""
        return value._base if self.handed_on and value._base is not None else value


def _output_hook(item: int | None, selected: Callable[[], bool], emit: Emit) -> Callable:
    """A forward hook emitting the output (``item``: one item of a tuple) at selected calls."""

    def forward_hook(mod: nn.Module, args: tuple, output: Any) -> Any:
        if not selected():
            return None
        raw = output if item is None else output[item]
        used = emit(raw)
        if used is raw:
            return None
        if item is None:
            return used
        items = list(output)
        items[item] = used
        return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)

    return forward_hook


def _every_call() -> bool:
    return True


@dataclass(frozen=True)
class OutputReader(Reader):
    """The module's output (``item``: one item of a tuple output)."""

    item: int | None = None

    def attach(
        self, module: nn.Module, emit: Emit, selected: Callable[[], bool] = _every_call
    ) -> list[RemovableHandle]:
        return [module.register_forward_hook(_output_hook(self.item, selected, emit))]


@dataclass(frozen=True)
class InputReader(Reader):
    """Positional input ``arg`` of the module."""

    arg: int = 0

    reads_input = True

    def attach(
        self, module: nn.Module, emit: Emit, selected: Callable[[], bool] = _every_call
    ) -> list[RemovableHandle]:
        def pre_hook(mod: nn.Module, args: tuple) -> tuple | None:
            if not selected():
                return None
            if len(args) <= self.arg:
                raise TypeError(
                    f"A {type(mod).__name__} was called with {len(args)} positional inputs; "
                    f"vizkit reads its positional input {self.arg}: pass that input "
                    "positionally, or leave this hook name out."
                )
            used = emit(args[self.arg])
            if used is args[self.arg]:
                return None
            return (*args[: self.arg], used, *args[self.arg + 1 :])

        return [module.register_forward_pre_hook(pre_hook)]


@dataclass(frozen=True)
class NthCall(Reader):
    """Call ``call`` (0-based) of a module that runs several times each time ``scope`` runs,
    read as ``inner`` says."""

    call: int
    scope: nn.Module = field(repr=False)
    inner: OutputReader | InputReader = field(default_factory=OutputReader)

    @property
    def reads_input(self) -> bool:
        return self.inner.reads_input

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        seen = [0]  # calls since the scope started, in this attachment

        def reset(mod: nn.Module, args: tuple) -> None:
            seen[0] = 0

        def selected() -> bool:
            seen[0] += 1
            return seen[0] - 1 == self.call

        reset_handle = self.scope.register_forward_pre_hook(reset)
        return [*self.inner.attach(module, emit, selected), reset_handle]


@dataclass(frozen=True)
class ComputedReader(Reader):
    """``compute(module, args, kwargs, output)`` each time the module runs, read only."""

    compute: Compute

    on_path = False
    refusal = "{name} is derived from {module}'s weights and input, not passed on by the forward"

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        def derived_hook(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            emit(self.compute(mod, args, kwargs, output))

        return [module.register_forward_hook(derived_hook, with_kwargs=True)]


@dataclass(frozen=True)
class ExplicitPathReader(Reader):
    """A map at the module's output (``item``: of a tuple) once ``switch()`` has put the
    attention on its explicit path for the call.

    ``handed_on``: the module returns the map beside an output it has already computed from it
    (a hook may read it, and take its gradient, but not replace it). ``beside``: a function
    attaching hooks that compute the map beside the fused kernel instead (`BesideReader`)."""

    switch: Callable[[], AbstractContextManager] = field(repr=False)
    item: int | None = None
    handed_on: bool = False
    beside: Beside | None = field(default=None, repr=False)

    @classmethod
    def returned(cls, switch: Callable[[], AbstractContextManager]) -> ExplicitPathReader:
        """A map the module returns beside its output, as item 1 of a tuple, under ``switch``
        (torch's ``need_weights``, transformers' eager attention)."""
        return cls(switch, item=1, handed_on=True)

    @property
    def refusal(self) -> str | None:
        if not self.handed_on:
            return None
        return "{module} returns {name} beside an output it has already computed from it"

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        return OutputReader(self.item).attach(module, emit)

    def switched(self) -> AbstractContextManager:
        return self.switch()


@dataclass(frozen=True)
class BesideReader(Reader):
    """An attention map computed beside the module's fused kernel: ``beside(on_map)`` attaches
    the hooks (on the module's own submodules) and returns their handles."""

    beside: Beside = field(repr=False)

    on_path = False
    refusal = "{name} is computed beside {module}'s fused kernel, not passed on by the forward"

    def attach(self, module: nn.Module, emit: Emit) -> list[RemovableHandle]:
        return self.beside(emit)
