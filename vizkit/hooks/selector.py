"""The naming vocabulary every analysis shares, with its one matcher and one "did you mean".

``layers=`` (a set of layers) and ``layer=`` (one layer) take

- an int, counting the analysis' own layers in forward order (its self-attention layers for
  `attention`, its blocks' outputs for `cka_matrix`, ...), negative from the end;
- a hook name (``blocks.3.attn.hook_pattern``, negative indices allowed: ``blocks.-1...``), a
  glob (``blocks.1?.attn.hook_pattern``), a compiled regex or a callable on names;
- a module path (``blocks.3``; Swin's stage ``layers.2``): the analysis' layers under it;
- or a list mixing any of these.

`match` finds what one name, glob, regex or callable selects among the known names;
`select_layers` adds ints and module paths. ``names=`` of ``run_with_cache`` and ``hooks``
(`vizkit.hooks.names`) takes the patterns without ints or module paths, through `match` too. A
pattern that selects nothing is refused with `did_you_mean`'s hint.

Example:
    >>> names = [f"blocks.{i}.attn.hook_pattern" for i in range(4)]
    >>> select_layers([0, -1], names)
    ['blocks.0.attn.hook_pattern', 'blocks.3.attn.hook_pattern']
    >>> select_layers(["blocks.2", "blocks.[12].*"], names)  # each layer once
    ['blocks.2.attn.hook_pattern', 'blocks.1.attn.hook_pattern']
    >>> match("blocks.-1.attn.hook_pattern", names), did_you_mean("blocks.1.atn", names, 1)
    (['blocks.3.attn.hook_pattern'], ' Did you mean: blocks.1.attn.hook_pattern?')
"""

from __future__ import annotations

import difflib
import fnmatch
import numbers
import re
from collections.abc import Callable, Sequence

from .inputs import check_indices

__all__ = [
    "LayerSpec",
    "Pattern",
    "did_you_mean",
    "layer_indices",
    "match",
    "nothing_matched",
    "resolve_negative_indices",
    "select_layer",
    "select_layers",
    "unknown_name_error",
]

Pattern = str | re.Pattern | Callable[[str], bool]
LayerSpec = int | str | re.Pattern | Callable[[str], bool] | Sequence[int | str | re.Pattern]

GLOB_CHARS = set("*?[")
_NEGATIVE = re.compile(r"-[1-9]\d*")


def is_glob(pattern: str) -> bool:
    return bool(GLOB_CHARS & set(pattern))


def match(pattern: Pattern, known: Sequence[str]) -> list[str]:
    """The names of ``known`` that ``pattern`` selects, in the order of ``known`` (empty when
    none): a regex by full match, a callable by its answer, a glob by `fnmatch`, a name
    exactly; a name's or glob's negative indices are counted back where they mean something
    in ``known``."""
    if isinstance(pattern, re.Pattern):
        return [name for name in known if pattern.fullmatch(name)]
    if callable(pattern):
        return [name for name in known if pattern(name)]
    pattern = counted_back(pattern, known) or pattern
    if is_glob(pattern):
        return fnmatch.filter(known, pattern)
    return [pattern] if pattern in known else []


def resolve_negative_indices(name: str, known: Sequence[str]) -> str:
    """Turn ``blocks.-1.attn.hook_pattern`` into ``blocks.11.attn.hook_pattern``.

    A negative component counts back from the last index that ``known`` has under the same prefix.

    Raises:
        KeyError: nothing is indexed under the prefix, or the index is out of its range.
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


def counted_back(name: str, known: Sequence[str]) -> str | None:
    """``name`` with its negative indices counted back over ``known`` (None where they mean
    nothing there)."""
    try:
        return resolve_negative_indices(name, known)
    except KeyError:
        return None


def did_you_mean(name: str, known: Sequence[str], count: int) -> str:
    """`` Did you mean: a, b?`` with up to ``count`` of the known names closest to ``name``
    (empty when none is close)."""
    close = difflib.get_close_matches(name, known, n=count, cutoff=0.5)
    return f" Did you mean: {', '.join(close)}?" if close else ""


def unknown_name_error(name: str, known: Sequence[str], what: str = "hook name") -> KeyError:
    """A KeyError for an unknown name, listing the closest known names."""
    hint = did_you_mean(name, known, 5)
    if name.endswith("_grad"):
        hint += " Gradients are requested with grads=True on the forward name, not by name."
    return KeyError(
        f"No {what} matches {name!r}.{hint} hook_names() lists all "
        f"{len(known)} names; globs ('blocks.*.attn.hook_pattern') work too."
    )


def nothing_matched(pattern: Pattern, known: Sequence[str]) -> KeyError:
    """The error for a pattern that `match` found nothing for among the hook names ``known``."""
    if isinstance(pattern, re.Pattern):
        return KeyError(f"The regex {pattern.pattern!r} matches none of the hook names.")
    if callable(pattern):
        return KeyError(
            f"The name filter {pattern!r} selected none of the {len(known)} hook names."
        )
    return unknown_name_error(pattern, known)


def select_layers(
    spec: LayerSpec,
    indexed: Sequence[str],
    named: Sequence[str] | None = None,
    *,
    arg: str = "layers",
    what: str = "layers",
) -> list[str]:
    """The hook names ``spec`` selects, each once, in the order given (a glob, regex, callable
    or module path adds its matches in forward order; a name selected twice counts once).

    Args:
        spec: see the module docstring.
        indexed: the analysis' layers in forward order; ints and module paths index these.
        named: the names a hook name or glob may select (default ``indexed``).
        arg, what: the argument's name and what ``indexed`` holds, for error messages.

    Raises:
        TypeError: ``spec`` (or an element of it) is none of the accepted kinds.
        ValueError: an index out of range, or an empty list.
        KeyError: a name that selects nothing.
    """
    named = list(indexed if named is None else named)
    if callable(spec) and not isinstance(spec, re.Pattern):
        return _matched(spec, named)
    if isinstance(spec, (str, re.Pattern, numbers.Integral)):
        items = [spec]
    elif isinstance(spec, (list, tuple, range)):
        items = list(spec)
        if not items:
            raise ValueError(f"{arg} is empty; pass None for the default {what} or some of them.")
    else:
        raise TypeError(_type_message(arg, spec, what))
    chosen: list[str] = []
    for item in items:
        if isinstance(item, numbers.Integral) and not isinstance(item, bool):
            chosen += [indexed[i] for i in check_indices(arg, item, len(indexed), what)]
        elif isinstance(item, str):
            chosen += _select_name(item, indexed, named, what)
        elif isinstance(item, re.Pattern):
            chosen += _matched(item, named)
        else:
            raise TypeError(_type_message(arg, item, what))
    return list(dict.fromkeys(chosen))


def select_layer(
    spec: LayerSpec,
    indexed: Sequence[str],
    named: Sequence[str] | None = None,
    *,
    arg: str = "layer",
    what: str = "layers",
) -> str:
    """The one hook name ``spec`` selects (as `select_layers`); a ValueError if it selects
    none or several."""
    names = select_layers(spec, indexed, named, arg=arg, what=what)
    if len(names) != 1:
        raise ValueError(
            f"{arg}={spec!r} selects {len(names)} {what} ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}); {arg} takes one: an int, a hook name or a "
            "module path such as 'blocks.3'."
        )
    return names[0]


def layer_indices(names: Sequence[str], indexed: Sequence[str]) -> list[int | None]:
    """Position of each name among ``indexed`` (None for a name outside it)."""
    position = {name: i for i, name in enumerate(indexed)}
    return [position.get(name) for name in names]


def _matched(pattern: re.Pattern | Callable[[str], bool], named: list[str]) -> list[str]:
    """What a regex or a callable selects among ``named`` (KeyError when nothing)."""
    found = match(pattern, named)
    if not found:
        raise nothing_matched(pattern, named)
    return found


def _select_name(item: str, indexed: Sequence[str], named: list[str], what: str) -> list[str]:
    """A hook name or glob over ``named``, else a module path over ``indexed``."""
    if is_glob(item):
        matched = match(item, named)
        if matched:
            return matched
        raise KeyError(_unknown(item, item, indexed, named, what))
    resolved = counted_back(item, named) or counted_back(item, indexed) or item
    if resolved in named:
        return [resolved]
    under = [n for n in indexed if n.startswith(resolved + ".")]
    if under:
        return under
    raise KeyError(_unknown(item, resolved, indexed, named, what))


def _unknown(item: str, resolved: str, indexed: Sequence[str], named: list[str], what: str) -> str:
    shown = f"{item!r}" + (f" ({resolved})" if resolved != item else "")
    hint = did_you_mean(resolved, named, 3)
    others = (
        f", nor another of the {len(named)} hook names it takes (hook_names() lists them)"
        if len(named) > len(indexed)
        else ""
    )
    return (
        f"{shown} matches none of the {len(indexed)} {what} ({_span(list(indexed))}) or a "
        f"module path above them{others}.{hint} Ints count the {what} "
        f"(0..{len(indexed) - 1}, negative from the end)."
    )


def _span(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{names[0]}, ..., {names[-1]}"


def _type_message(arg: str, value: object, what: str) -> str:
    return (
        f"{arg} must be an int (negative from the end), a hook name, a glob, a module path "
        f"such as 'blocks.3', or a list of these; got {value!r} for the {what}."
    )
