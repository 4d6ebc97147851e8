"""Name filters: exact names, globs, regexes and callables over canonical hook names."""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Sequence

__all__ = [
    "NameSpec",
    "collapsed_names",
    "explicit_names",
    "resolve_names",
    "resolve_negative_indices",
    "unknown_name_error",
]

NameSpec = str | re.Pattern | Callable[[str], bool] | Sequence[str | re.Pattern]

GLOB_CHARS = set("*?[")
_NEGATIVE = re.compile(r"-[1-9]\d*")


def resolve_negative_indices(name: str, known: Sequence[str]) -> str:
    """Turn ``blocks.-1.attn.hook_pattern`` into ``blocks.11.attn.hook_pattern``.

    A negative component counts back from the last index that ``known`` has under the same prefix.
    """
    parts = name.split(".")
    for pos, part in enumerate(parts):
        if not _NEGATIVE.fullmatch(part):
            continue
        prefix = ".".join(parts[:pos]) + "."
        indices = sorted(
            {
                int(k[len(prefix) :].split(".", 1)[0])
                for k in known
                if k.startswith(prefix) and k[len(prefix) :].split(".", 1)[0].isdigit()
            }
        )
        if not indices:
            raise KeyError(
                f"{name!r}: nothing is indexed under {prefix[:-1]!r}, so {part} means "
                "nothing here. Use hook_names() to see the valid names."
            )
        if -int(part) > len(indices):
            raise KeyError(
                f"{name!r}: {prefix[:-1]!r} has {len(indices)} entries "
                f"(0..{indices[-1]}), so index {part} is out of range."
            )
        parts[pos] = str(indices[int(part)])
    return ".".join(parts)


def unknown_name_error(name: str, known: Sequence[str], what: str = "hook name") -> KeyError:
    """A KeyError for an unknown name, listing the closest known names."""
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    if name.endswith("_grad"):
        hint += " Gradients are requested with grads=True on the forward name, not by name."
    return KeyError(
        f"No {what} matches {name!r}.{hint} hook_names() lists all "
        f"{len(known)} names; globs ('blocks.*.attn.hook_pattern') work too."
    )


def resolve_names(spec: NameSpec, known: Sequence[str]) -> list[str]:
    """The names of ``known`` selected by ``spec``, in the order of ``known``.

    Args:
        spec: an exact name, a glob (``*``, ``?``, ``[``), a compiled regex (full match), a
            callable ``name -> bool``, or a list of names/globs/regexes. Negative layer indices
            (``blocks.-1.attn.hook_pattern``) are resolved first.
        known: all valid names, in canonical order.

    Raises:
        KeyError: if ``spec`` (or any element of a list) matches nothing.
        TypeError: if ``spec`` is none of the accepted kinds.
    """
    if callable(spec) and not isinstance(spec, re.Pattern):
        chosen = {n for n in known if spec(n)}
        if not chosen:
            raise KeyError(
                f"The name filter {spec!r} selected none of the {len(known)} hook names."
            )
    elif isinstance(spec, (str, re.Pattern)):
        chosen = _match_one(spec, known)
    elif (
        isinstance(spec, Sequence) and spec and all(isinstance(s, (str, re.Pattern)) for s in spec)
    ):
        chosen = set().union(*(_match_one(s, known) for s in spec))
    else:
        raise TypeError(
            f"names must be a name, a glob, a compiled regex, a callable or a non-empty "
            f"list of names/globs/regexes; got {spec!r}."
        )
    return [n for n in known if n in chosen]


def _match_one(pattern: str | re.Pattern, known: Sequence[str]) -> set[str]:
    if isinstance(pattern, re.Pattern):
        chosen = {n for n in known if pattern.fullmatch(n)}
        if not chosen:
            raise KeyError(f"The regex {pattern.pattern!r} matches none of the hook names.")
        return chosen
    pattern = resolve_negative_indices(pattern, known)
    if GLOB_CHARS & set(pattern):
        chosen = set(fnmatch.filter(known, pattern))
    else:
        chosen = {pattern} if pattern in set(known) else set()
    if not chosen:
        raise unknown_name_error(pattern, known)
    return chosen


def explicit_names(spec: NameSpec, known: Sequence[str]) -> set[str]:
    """The names ``spec`` gives literally (no glob, regex or callable): these must fire."""
    items = [spec] if isinstance(spec, (str, re.Pattern)) or callable(spec) else list(spec)
    return {
        resolve_negative_indices(s, known)
        for s in items
        if isinstance(s, str) and not (GLOB_CHARS & set(s))
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
