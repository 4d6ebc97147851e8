"""What one call of `HookedModel.hooks` or `HookedModel.run_with_cache` asks for, checked and
frozen before anything is attached: the names to hook, edit, cache and differentiate, and the
budgets and casts of the cache."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .beside import PATTERN_PATHS
from .inputs import check_choice, check_count, check_device
from .names import NameSpec, explicit_names, resolve_names
from .scores import Target, class_indices

__all__ = ["HookFn", "Hooks", "Request", "expand_hooks"]

HookFn = Callable[..., Tensor | None]  # fn(tensor, *, name) -> replacement or None
Hooks = Mapping[NameSpec, HookFn | list[HookFn]]


@dataclass(frozen=True)
class Request:
    """One call's request.

    Attributes:
        fwd, bwd: canonical name -> the functions run on its value / on its gradient.
        record: names to cache; ``keep_for_grad``: those whose gradient is cached too.
        explicit: names asked for literally (not by a pattern): these must fire.
        start_graph: the call differentiates, so a tap whose gradient is wanted starts the graph.
        read_only: no function may replace a value (maps may then be computed beside a fused
            kernel); ``pattern_path``: how maps are made (`vizkit.hooks.beside.PATTERN_PATHS`).
        device, dtype: where cached values go and what they are cast to (None: as made).
        max_bytes: the cache's limit (None: no limit).
    """

    fwd: dict[str, list[HookFn]] = field(default_factory=dict)
    bwd: dict[str, list[HookFn]] = field(default_factory=dict)
    record: frozenset[str] = frozenset()
    keep_for_grad: frozenset[str] = frozenset()
    explicit: frozenset[str] = frozenset()
    start_graph: bool = False
    read_only: bool = False
    pattern_path: str = "unfused"
    device: torch.device | str | None = None
    dtype: torch.dtype | None = None
    max_bytes: int | None = None

    def names(self) -> set[str]:
        """Every name a hook is attached for."""
        return set(self.fwd) | set(self.bwd) | self.record

    def wants_grad(self, name: str) -> bool:
        """Whether ``name``'s gradient is cached or handed to a backward function."""
        return name in self.keep_for_grad or name in self.bwd

    @classmethod
    def for_hooks(
        cls, known: Sequence[str], fwd: Hooks | None, bwd: Hooks | None, read_only: bool
    ) -> Request:
        """The request of ``hooks(fwd, bwd, read_only=)`` over the hook names ``known``."""
        explicit = set().union(*(explicit_names(spec, known) for spec in fwd or {}))
        return cls(
            fwd=expand_hooks(fwd, known),
            bwd=expand_hooks(bwd, known),
            explicit=frozenset(explicit),
            read_only=read_only,
            pattern_path="auto" if read_only and not bwd else "unfused",  # bwd: maps on the path
        )

    @classmethod
    def for_cache(
        cls, known: Sequence[str], names: NameSpec, batch: int, *, grads: bool, target: Target,
        device: torch.device | str | None, max_bytes: int, bwd: Hooks | None,
        dtype: torch.dtype | None, pattern_path: str,
    ) -> tuple[Request, list[str]]:  # fmt: skip
        """The request of ``run_with_cache`` (see there) over the hook names ``known`` for a
        batch of ``batch`` images, and the names it caches; every argument checked."""
        max_bytes = check_count("max_bytes", max_bytes)
        device = None if device is None else check_device(device)
        check_choice("pattern_path", pattern_path, PATTERN_PATHS)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype or None; got {dtype!r}.")
        backward = grads or bool(bwd)
        if backward and pattern_path == "beside":
            raise ValueError(
                "pattern_path='beside' computes maps off the output's path, so they have no "
                "gradient; use pattern_path='auto' or 'unfused' with grads=True or bwd=."
            )
        if target is not None and not backward:
            raise ValueError(
                "target= chooses the score to differentiate; pass grads=True (or bwd=) with it."
            )
        if backward and target is not None and not callable(target):
            class_indices(target, batch)  # types and count, before the forward
        chosen = resolve_names(names, known)
        request = cls(
            bwd=expand_hooks(bwd, known),
            record=frozenset(chosen),
            keep_for_grad=frozenset(chosen if grads else ()),
            explicit=frozenset(explicit_names(names, known)),
            start_graph=backward,
            read_only=not backward,
            pattern_path="unfused" if backward else pattern_path,
            device=device,
            dtype=dtype,
            max_bytes=max_bytes,
        )
        return request, chosen


def expand_hooks(hooks: Hooks | None, known: Sequence[str]) -> dict[str, list[HookFn]]:
    """``{name or pattern: fn or [fns]}`` as ``{canonical name: [fns]}`` over ``known``."""
    expanded: dict[str, list[HookFn]] = {}
    for spec, fns in (hooks or {}).items():
        fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
        if not all(callable(f) for f in fns):
            raise TypeError(
                f"Hook for {spec!r} must be a callable fn(tensor, *, name); got {fns!r}."
            )
        for name in resolve_names(spec, known):
            expanded.setdefault(name, []).extend(fns)
    return expanded
