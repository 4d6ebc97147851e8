"""A run's settings: a frozen dataclass of JSON values, written beside the run and compared
field by field when the run is resumed, so that a resume with other settings is refused with
each difference named (saev's typed configs are the anchor).

A subclass declares its fields with types and a docstring per field, and checks their ranges
in ``__post_init__`` (the run's arguments are refused before any work); `differences` names
what changed between a saved run and the one asked for.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

__all__ = ["Settings", "differences"]

S = TypeVar("S", bound="Settings")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Base of a run's settings (subclasses are ``@dataclass(frozen=True)``)."""

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object (tuples as lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_json(cls: type[S], data: dict[str, Any], where: str) -> S:
        """The settings saved as ``data`` (`to_json`) in ``where``; a field missing or unknown
        is refused, naming it (the file is of another version or was edited)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            found = set(data) if isinstance(data, dict) else set()
            raise ValueError(
                f"{where} holds settings vizkit cannot read (missing: "
                f"{sorted(names - found) or 'none'}; unknown: {sorted(found - names) or 'none'}): "
                "it was written by another vizkit version or edited. Write the run again in "
                "a new folder."
            )
        return cls(**{name: _tuples(value) for name, value in data.items()})

    def differences(self, given: Settings) -> list[str]:
        """``"field: self's value -> given's"`` for every field that differs (nested objects
        by path)."""
        return differences(self.to_json(), given.to_json())


def differences(expected: dict, found: dict, prefix: str = "") -> list[str]:
    """``"key: expected -> found"`` for every key whose value differs (nested dicts by path)."""
    lines = []
    for key in sorted(set(expected) | set(found)):
        a, b = expected.get(key), found.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: {_short(a)} -> {_short(b)}")
    return lines


def _tuples(value: Any) -> Any:
    """JSON lists back as the tuples a frozen dataclass holds (dicts as they are)."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
