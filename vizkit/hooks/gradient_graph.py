"""The autograd graph of one call that differentiates: where it starts (the earliest activation
whose gradient is wanted; nothing before it is recorded), the tensors the forward went on with
(whose gradients are read), and the backward functions on them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .edits import check_replacement
from .readers import Reader
from .request import HookFn, Request
from .scores import Target, target_score
from .taps import Tap

__all__ = ["GradientGraph", "frozen_parameters", "recording_from_taps", "refuse_derived_gradients"]


@dataclass
class GradientGraph:
    """Attributes:
    starts: activations made to require grad (the graph's starts; cleared by `release`).
    used: name -> the tensor the forward went on with, whose gradient is the name's.
    views: name -> the value's shape, where ``used`` is the base it is a view of.
    watched: name -> (map, version): maps the forward went on with, which must not change.
    """

    starts: list[Tensor] = field(default_factory=list)
    used: dict[str, Tensor] = field(default_factory=dict)
    views: dict[str, torch.Size] = field(default_factory=dict)
    watched: dict[str, tuple[Tensor, int]] = field(default_factory=dict)

    def start(self, tap: Tap, used: Tensor, model: nn.Module) -> None:
        """Start recording at ``used`` (`recording_from_taps`): nothing before this activation
        is in the graph, everything after it is. The flag is set on the tensor itself, not a
        detached copy, so every later use of it (a residual branch beside the hooked module,
        too) carries the gradient; it is cleared after the call."""
        if isinstance(used, nn.Parameter) or any(used is b for b in model.buffers()):
            raise ValueError(
                f"{tap.name} is a parameter or buffer of the model, not an activation; take the "
                "gradient at an activation."
            )
        used.requires_grad_(True)
        self.starts.append(used)
        torch.set_grad_enabled(True)

    def attach_start(self, tap: Tap, module: nn.Module, model: nn.Module) -> RemovableHandle:
        """For a value the module hands on after using it (read only): start the graph at the
        module's first floating input, so that the value is on the output's path."""

        def start_at_input(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            first = next(
                (v for v in (*args, *kwargs.values())
                 if isinstance(v, Tensor) and v.is_floating_point()),
                None,
            )  # fmt: skip
            if first is not None and not first.requires_grad:
                self.start(tap, first, model)

        return module.register_forward_pre_hook(start_at_input, with_kwargs=True)

    def hand_on(
        self, tap: Tap, reader: Reader, used: Tensor, request: Request, model: nn.Module
    ) -> Tensor:
        """The tensor the forward goes on with in place of ``used``: where ``tap``'s gradient
        is wanted, the graph starts here if it has not yet, the backward functions are
        attached, and the forward goes on with a copy (a later in-place op would rewrite the
        value whose gradient is read) or, for an attention map, with the map, watched.
        ``reader``: how the value was read (`Reader.on_path_of`: the tensor the gradient is
        taken at)."""
        wanted = request.wants_grad(tap.name)
        if request.start_graph and wanted and not used.requires_grad:
            self.start(tap, used, model)
        on_path = reader.on_path_of(used)
        if tap.name in request.keep_for_grad:
            self.used[tap.name] = on_path
            if on_path is not used:
                self.views[tap.name] = used.shape
        if not used.requires_grad or not wanted:
            return used
        for fn in request.bwd.get(tap.name, ()):
            on_path.register_hook(_gradient_hook(fn, tap, used.shape))
        if tap.kind:  # an attention map (B·H·N² floats): the forward goes on with it, and an
            self.watched[tap.name] = (used, used._version)  # in-place change is refused after
            return used
        return used.clone()

    def changed(self) -> list[str]:
        """The watched maps changed in place since they were handed on."""
        return [name for name, (t, version) in self.watched.items() if t._version != version]

    def gradients(
        self, output: Any, target: Target, chosen: list[str], request: Request,
        taps: dict[str, Tap], batch: int,
    ) -> dict[str, Tensor]:  # fmt: skip
        """The gradient of the target score (on a batch of ``batch`` images) with respect to
        each of ``chosen`` whose gradient is kept, canonical, cast and moved as the request
        says (zeros where the score does not depend on it); with only backward functions, the
        backward is run for them."""
        with torch.enable_grad():
            score = target_score(output, target, batch)
        chosen = [n for n in chosen if n in request.keep_for_grad]
        inputs = [self.used[n] for n in chosen] or self.starts  # bwd only: run the backward
        if not score.requires_grad:
            raise RuntimeError(
                f"The target score does not depend on {chosen or sorted(request.bwd)} (values "
                "computed beside the output, not on its path), so they have no gradient."
            )
        grads = torch.autograd.grad(score, inputs, allow_unused=True)
        if not chosen:
            return {}
        result = {}
        for name, used, grad in zip(chosen, inputs, grads, strict=False):
            grad = torch.zeros_like(used) if grad is None else grad  # unused: the gradient is 0
            grad = grad.reshape(self.views[name]) if name in self.views else grad
            grad = taps[name].to_canonical(grad).detach()
            result[name] = grad.to(request.device, request.dtype)
        return result

    def release(self) -> None:
        """The starts no longer require grad (the caller's tensors are as they were)."""
        for start in self.starts:
            start.requires_grad_(False)


def refuse_derived_gradients(names: Iterable[str], taps: dict[str, Tap], fix: str) -> None:
    """Refuse gradients of values computed beside the forward (a tap whose reader is not on
    the output's path: no gradient flows through them)."""
    derived = [n for n in names if not taps[n].read.on_path]
    if derived:
        raise ValueError(
            f"{derived} are derived values (computed from a module's weights and input, not "
            f"tensors the forward passes on), so no gradient flows through them; {fix}."
        )


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Parameters do not require grad inside the block (no tensor is saved for their
    gradients); each one's ``requires_grad`` is restored on exit, also after an error."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


@contextmanager
def recording_from_taps(model: nn.Module) -> Iterator[None]:
    """Autograd off, and parameters frozen, for the call; a tap whose gradient is wanted
    switches recording on when it fires (`GradientGraph.start`), so the graph holds only the
    network between the earliest such activation and the output. Grad mode is restored on
    exit, also after an error."""
    with frozen_parameters(model), torch.no_grad():
        yield


def _gradient_hook(
    fn: HookFn, tap: Tap, shape: torch.Size | None = None
) -> Callable[[Tensor], Tensor | None]:
    """``fn`` on the gradient in ``tap``'s canonical layout (``shape``: the value's, where the
    gradient arrives at the base it is a view of)."""

    def hook(grad: Tensor) -> Tensor | None:
        raw = grad if shape is None else grad.reshape(shape)
        canonical = tap.to_canonical(raw)
        new = fn(canonical, name=tap.name)
        if new is None:
            return None
        check_replacement(f"{tap.name} (backward)", new, canonical)
        return tap.from_canonical(new, raw).reshape(grad.shape)

    return hook
