"""What one call has seen: the values it cached (cast, moved, with their versions), the bytes
they hold against the request's budget, and how often each name fired."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor

from .request import Request
from .taps import Tap
from .training_mode import warn_caller

__all__ = ["Capture", "require_fired"]


@dataclass
class Capture:
    """Values (canonical layout, detached) by name, their version counters when recorded, the
    bytes they hold, the names that fired (and how often), and the pattern matches that gave no
    tensor."""

    values: dict[str, Tensor] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    fired: Counter = field(default_factory=Counter)
    non_tensor: set[str] = field(default_factory=set)
    held_bytes: int = 0

    def record(self, name: str, value: Tensor, request: Request) -> None:
        """Keep ``value`` (B, ...) as ``name``'s: refused once the cache would pass the
        request's ``max_bytes`` (a gradient to come counts twice); ``.hook_out`` values are
        copied (a later in-place op on the module's output would change them)."""
        self._count_bytes(name, value, request)
        kept = value.detach()
        kept = kept.clone() if name.endswith(".hook_out") else kept
        self.values[name] = kept.to(request.device, request.dtype)
        if not kept.is_inference():  # inference tensors have no version counter
            self.versions[name] = kept._version

    def check(self, request: Request, changed_on_path: Sequence[str] = ()) -> None:
        """Warn about cached names that fired twice; raise if a cached value (or one of
        ``changed_on_path``, values the forward went on with) was changed in place after."""
        for name, count in self.fired.items():
            if name in request.record and count > 1:
                warn_caller(
                    f"{name} fired {count} times in one forward (a module called "
                    "several times); the cache holds the last call."
                )
        changed = [n for n, v in self.versions.items() if self.values[n]._version != v]
        changed += list(changed_on_path)
        if changed:
            raise RuntimeError(
                f"{changed} were modified in place after capture by a later "
                "module, so the cache would not hold what they were. (vizkit copies "
                "'.hook_out' captures; capture the module's .hook_out instead.)"
            )

    def not_a_tensor(self, tap: Tap, request: Request, raw: object) -> object:
        """A module gave no tensor: skipped (not fired) where a pattern matched its
        ``.hook_out``, else refused."""
        if tap.name not in request.explicit and tap.name.endswith(".hook_out"):
            self.non_tensor.add(tap.name)
            return raw
        raise TypeError(
            f"{tap.name}: module {tap.module!r} gave a {type(raw).__name__}, not a tensor; "
            "vizkit hooks tensors only. Hook a submodule instead."
        )

    def _count_bytes(self, name: str, value: Tensor, request: Request) -> None:
        if request.max_bytes is None:
            return
        self.held_bytes += value.nbytes * (2 if name in request.keep_for_grad else 1)
        if self.held_bytes > request.max_bytes:
            what = "activations and gradients" if request.keep_for_grad else "activations"
            raise ValueError(
                f"The cache of {what} passed max_bytes={request.max_bytes / 2**20:.1f} MiB at "
                f"{name} ({self.held_bytes / 2**20:.1f} MiB so far, {len(self.values) + 1} "
                "names). Ask for fewer names, a smaller batch or a larger max_bytes."
            )


def require_fired(
    chosen: list[str], fired: Counter, explicit: set[str], non_tensor: set[str] = frozenset()
) -> list[str]:
    """The chosen names that fired. Raise if a name asked for literally (or every name) did not
    fire; warn about pattern matches that did not (modules off this forward path, or modules
    whose output is a tuple or list: ``non_tensor``)."""
    silent = [n for n in chosen if not fired[n]]
    if silent and len(silent) == len(chosen) and set(silent) <= non_tensor:
        raise TypeError(
            f"{silent} gave tuples or lists, not tensors; vizkit hooks tensors only. Hook a "
            "submodule instead."
        )
    if silent and (explicit & set(silent) or len(silent) == len(chosen)):
        raise RuntimeError(
            f"Requested hooks did not fire: {silent}. Run the model inside the "
            "context; if you did, the forward path bypassed these modules (e.g. a "
            "pooling or head option that skips them)."
        )
    if silent:
        warn_caller(
            f"{len(silent)} names matched by a pattern did not fire (their modules are "
            f"not on this forward path): {silent}"
        )
    return [n for n in chosen if fired[n]]
