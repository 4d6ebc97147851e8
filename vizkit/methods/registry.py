"""The saliency-method registry: a method is defined once, registered with what it needs, and
everything that lists methods (`compare_saliency`, the coverage table, the top-level exports,
the docs) reads this registry.

A method is a function ``fn(model, x, target=None, **options) -> SaliencyResult`` (the analysis
contract: a model or HookedModel, images (B, C, H, W)), registered with `saliency_method`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "METHODS",
    "NEEDS",
    "SaliencyMethod",
    "default_methods",
    "registered",
    "saliency_method",
    "selected_methods",
]

# what a method may need, for the tables that list methods
NEEDS = {
    "gradients": "a backward pass from the target score",
    "attention": "the model's attention maps",
    "layer": "one activation (a token stream or a feature map)",
    "forwards": "extra forward passes on perturbed inputs or activations",
}


@dataclass(frozen=True)
class SaliencyMethod:
    """A registered method.

    Attributes:
        name: the name `compare_saliency(methods=[...])` and the tables use.
        fn: ``fn(model, x, target=None, **options) -> SaliencyResult``.
        needs: keys of `NEEDS`.
        summary: one line for the tables: what the map is, and its paper.
        targets: whether the map depends on the target class (rollout's does not).
        default: whether the report and the saliency explorer run it unless told otherwise.
    """

    name: str
    fn: Callable
    needs: tuple[str, ...]
    summary: str
    targets: bool = True
    default: bool = False

    def __call__(self, model, x, target=None, **options):
        if self.targets:
            return self.fn(model, x, target=target, **options)
        return self.fn(model, x, **options)


_METHODS: dict[str, SaliencyMethod] = {}


def saliency_method(
    name: str,
    *,
    needs: tuple[str, ...] = (),
    summary: str,
    targets: bool = True,
    default: bool = False,
) -> Callable[[Callable], Callable]:
    """Register the decorated function as saliency method ``name``; returns it unchanged."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"{name}: unknown needs {sorted(unknown)}; known: {sorted(NEEDS)}.")

    def register(fn: Callable) -> Callable:
        if name in _METHODS and _METHODS[name].fn is not fn:
            raise ValueError(f"A saliency method {name!r} is registered already.")
        _METHODS[name] = SaliencyMethod(name, fn, tuple(needs), summary, targets, default)
        return fn

    return register


_BUILTINS = "vizkit.methods.builtin"  # imports every built-in method's module


def _methods() -> dict[str, SaliencyMethod]:
    """Every registered method by name: the built-ins (`vizkit.methods.builtin`) by name, then
    the others in registration order."""
    if _BUILTINS not in sys.modules:
        importlib.import_module(_BUILTINS)
    ours = [m for m in _METHODS.values() if m.fn.__module__.startswith(f"{__package__}.")]
    others = [m for m in _METHODS.values() if m not in ours]
    return {m.name: m for m in [*sorted(ours, key=lambda m: m.name), *others]}


def registered(name: str) -> SaliencyMethod:
    """The method registered as ``name``; a KeyError naming the known ones otherwise."""
    known = _methods()
    if name not in known:
        raise KeyError(f"Unknown saliency method {name!r}; known: {', '.join(known)}.")
    return known[name]


def default_methods(has_attention: bool) -> list[str]:
    """The methods run unless told otherwise (`SaliencyMethod.default`), in registry order;
    those that need attention maps only for a model with self-attention (``has_attention``);
    the chance level last."""
    return selected_methods("default", has_attention)


def selected_methods(which: str, has_attention: bool) -> list[str]:
    """The names "all" (every registered method) or "default" (`default_methods`) stand for,
    in registry order with the chance level ("random") last."""
    if which not in ("all", "default"):
        raise ValueError(f"Expected 'all' or 'default'; got {which!r}.")
    chosen = [
        name
        for name, method in _methods().items()
        if which == "all" or (method.default and (has_attention or "attention" not in method.needs))
    ]
    return sorted(chosen, key=lambda name: name == "random")


class _Registered(Mapping):
    """A read-only view of the registry: name -> `SaliencyMethod` (callable as
    ``method(model, x, target)``)."""

    def __getitem__(self, name: str) -> SaliencyMethod:
        return _methods()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_methods())

    def __len__(self) -> int:
        return len(_methods())

    def __repr__(self) -> str:
        return f"METHODS({', '.join(_methods())})"


METHODS: Mapping[str, SaliencyMethod] = _Registered()
