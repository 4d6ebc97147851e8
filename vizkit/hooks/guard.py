"""One call at a time per model: a per-model lock, a refusal of vizkit calls made from inside
the model's own forward (a hook that runs an analysis on the model it is hooked into), and the
model's eager forward for the call (one compiled in place runs uncompiled while held).

Two threads that share a model run one after the other; the same thread may nest vizkit calls
(an analysis inside a ``hooks`` context), but not while the model's forward is running, where the
inner call's forward would fire the outer call's hooks and mix their results.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["exclusive", "tracking_forward"]


class _Guard:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.forward_depth = 0  # forwards of the model running under vizkit hooks


_guards: weakref.WeakKeyDictionary[nn.Module, _Guard] = weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


def _guard(model: nn.Module) -> _Guard:
    with _guards_lock:
        if model not in _guards:
            _guards[model] = _Guard()
        return _guards[model]


@contextmanager
def _eager(model: nn.Module) -> Iterator[None]:
    """``model`` and its submodules run their plain forward inside the context, also where
    ``module.compile()`` compiled them in place (dynamo cannot trace vizkit's hooks, which
    read tensor sizes); the compiled calls are restored on exit."""
    compiled = [(m, m._compiled_call_impl) for m in model.modules()
                if getattr(m, "_compiled_call_impl", None) is not None]  # fmt: skip
    for module, _ in compiled:
        module._compiled_call_impl = None
    try:
        yield
    finally:
        for module, call in compiled:
            module._compiled_call_impl = call


@contextmanager
def exclusive(model: nn.Module) -> Iterator[None]:
    """Hold ``model`` for this thread: other threads wait until the context exits, and the
    model runs eagerly, also where ``model.compile()`` compiled it in place.

    Raises:
        RuntimeError: called from inside a forward of ``model`` that vizkit is hooking.
    """
    guard = _guard(model)
    with guard.lock, _eager(model):
        if guard.forward_depth:
            raise RuntimeError(
                f"vizkit was called on {type(model).__name__} from inside its own forward (a "
                "hook function that runs an analysis or the model again); the inner forward "
                "would fire the outer call's hooks and mix their results. Collect what the hook "
                "needs and run the analysis after the forward returns."
            )
        yield


@contextmanager
def tracking_forward(model: nn.Module) -> Iterator[None]:
    """Count ``model``'s running forwards while the context is open (for `exclusive`); call
    inside ``exclusive(model)``."""
    guard = _guard(model)
    depth = guard.forward_depth

    def enter(module: nn.Module, args: tuple) -> None:
        guard.forward_depth += 1

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        guard.forward_depth -= 1

    handles = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        guard.forward_depth = depth  # a forward that raised never ran `leave`
