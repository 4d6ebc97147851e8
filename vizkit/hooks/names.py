"""Hook names chosen, required and shown: ``names=`` of ``run_with_cache`` and ``hooks`` (exact
names, globs, regexes and callables over canonical hook names, matched by
`vizkit.hooks.selector`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .selector import is_glob, match, nothing_matched, resolve_negative_indices

__all__ = ["NameSpec", "collapsed_names", "explicit_names", "resolve_names"]

NameSpec = str | re.Pattern | Callable[[str], bool] | Sequence[str | re.Pattern]


def resolve_names(spec: NameSpec, known: Sequence[str]) -> list[str]:
    """The names of ``known`` selected by ``spec``, in the order of ``known``.

    Args:
        spec: an exact name, a glob (``*``, ``?``, ``[``), a compiled regex (full match), a
            callable ``name -> bool``, or a list of names/globs/regexes. Negative layer indices
            (``blocks.-1.attn.hook_pattern``) are resolved first.
        known: all valid names, in canonical order.

    Raises:
        KeyError: if ``spec`` (or any element of a list) matches nothing, or holds a negative
            index that means nothing among ``known``.
        TypeError: if ``spec`` is none of the accepted kinds.
    """
    if isinstance(spec, (str, re.Pattern)) or callable(spec):
        patterns = [spec]
    elif (
        isinstance(spec, Sequence) and spec and all(isinstance(s, (str, re.Pattern)) for s in spec)
    ):
        patterns = list(spec)
    else:
        raise TypeError(
            f"names must be a name, a glob, a compiled regex, a callable or a non-empty "
            f"list of names/globs/regexes; got {spec!r}."
        )
    chosen: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, str):  # a negative index that means nothing here is an error
            pattern = resolve_negative_indices(pattern, known)
        found = match(pattern, known)
        if not found:
            raise nothing_matched(pattern, known)
        chosen.update(found)
    return [n for n in known if n in chosen]


def explicit_names(spec: NameSpec, known: Sequence[str]) -> set[str]:
    """The names ``spec`` gives literally (no glob, regex or callable): these must fire."""
    items = [spec] if isinstance(spec, (str, re.Pattern)) or callable(spec) else list(spec)
    return {
        resolve_negative_indices(s, known) for s in items if isinstance(s, str) and not is_glob(s)
    }


def collapsed_names(names: Sequence[str]) -> list[tuple[str, str]]:
    """``names`` grouped by their first index, as (``blocks.{0..11}.attn.hook_pattern``, the
    group's first name), in first-seen order."""
    groups: dict[str, tuple[list[int], str]] = {}
    for name in names:
        parts = name.split(".")
        digits = [i for i, part in enumerate(parts) if part.isdigit()]
        if not digits:
            groups[name] = ([], name)
            continue
        pos = digits[0]
        group = ".".join([*parts[:pos], "{}", *parts[pos + 1 :]])
        groups.setdefault(group, ([], name))[0].append(int(parts[pos]))
    return [
        (group.replace("{}", _index_range(ids)), first) for group, (ids, first) in groups.items()
    ]


def _index_range(indices: list[int]) -> str:
    if not indices:
        return ""
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 1:
        return f"{{{indices[0]}..{indices[-1]}}}"
    return "{" + ",".join(map(str, indices)) + "}"
