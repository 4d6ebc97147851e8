"""The protocol every result class shares: what it was computed with, a JSON round trip, a
compact repr and, for tables, HTML.

A result is a dataclass that inherits `Result`. Every result answers

- ``options``: the resolved settings it was computed with (hook names, not patterns);
- ``layout``: the model's `TokenLayout` at the input size (None without tokens or input);
- ``image_size``: (H, W) of the input (None for results read from parameters alone);

as its own fields where it has them, else ``{}`` / None. ``to_dict()`` gives plain JSON types
(tensors keep dtype and shape; NaN and infinities are strings, so the JSON is strict)
tagged with the class, and ``Result.from_dict`` (or
``SomeResult.from_dict``) rebuilds an equal result: training histories store results this way.

Example:
    >>> import json, torch
    >>> from vizkit.analysis import SaliencyResult
    >>> result = SaliencyResult(torch.ones(1, 2, 2), "demo", (32, 32))
    >>> result
    SaliencyResult(maps=<(1, 2, 2) float32>, method='demo', image_size=(32, 32), ...)
    >>> back = Result.from_dict(json.loads(json.dumps(result.to_dict())))
    >>> torch.equal(back.maps, result.maps), back.image_size
    (True, (32, 32))
"""

from __future__ import annotations

import dataclasses
import html
import math
import numbers
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from ..hooks import TokenLayout

__all__ = ["Result", "decode", "encode"]

TYPE_KEY = "__type__"
_PROTOCOL_DEFAULTS = {"options": dict, "layout": lambda: None, "image_size": lambda: None}
_MAX_LIST = 6  # list items a repr shows before eliding
_MAX_TEXT = 60  # or characters


class Result:
    """Mixin of every result dataclass (declare it with ``@dataclass(repr=False)``)."""

    registry: ClassVar[dict[str, type]] = {"TokenLayout": TokenLayout}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        known = Result.registry.get(cls.__name__)
        if known is not None and known.__module__ != cls.__module__:
            raise TypeError(
                f"A result class {cls.__name__!r} exists already ({known.__module__}); results "
                "are stored by class name, so give this one another name."
            )
        Result.registry[cls.__name__] = cls

    def __getattr__(self, name: str) -> Any:
        """``options``, ``layout`` and ``image_size`` of a result without such a field."""
        if name in _PROTOCOL_DEFAULTS:
            return _PROTOCOL_DEFAULTS[name]()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict:
        """JSON types only: ``{"__type__": class name, field: encoded value, ...}``."""
        return encode(self)

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        """The result ``to_dict`` gave ``data`` (``Result.from_dict`` takes any result class;
        a subclass checks the tag is its own)."""
        if not isinstance(data, dict) or TYPE_KEY not in data:
            keys = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"Not a result written by Result.to_dict (no {TYPE_KEY!r} tag; got {keys}). "
                "Training histories written before vizkit stored results this way hold plain "
                "lists: train again, or rebuild the result from them."
            )
        result = decode(data)
        if not isinstance(result, cls):
            raise TypeError(f"{cls.__name__}.from_dict got a {type(result).__name__}.")
        return result

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{f.name}={_short(getattr(self, f.name))}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None and f.repr
        )
        return f"{type(self).__name__}({parts})"

    def rows(self) -> list[dict] | None:
        """The result as table rows (column -> value) for tabular results, else None."""
        return None

    def _repr_html_(self) -> str | None:
        rows = self.rows()
        if not rows:
            return None  # Jupyter falls back to the repr
        columns = list(rows[0])
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell(row[c]))}</td>" for c in columns) + "</tr>"
            for row in rows
        )
        caption = f"<caption>{html.escape(type(self).__name__)}</caption>"
        return f"<table>{caption}<tr>{head}</tr>{body}</table>"


def encode(value: Any) -> Any:
    """``value`` in JSON types; tensors, tuples, results and layouts tagged with ``__type__``."""
    if isinstance(value, Tensor):
        data = value.detach().cpu()
        return {
            TYPE_KEY: "Tensor",
            "dtype": str(data.dtype).removeprefix("torch."),
            "shape": list(data.shape),
            "data": [_finite(v) for v in data.flatten().tolist()],
        }
    if dataclasses.is_dataclass(value) and type(value).__name__ in Result.registry:
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {TYPE_KEY: type(value).__name__, **fields}
    if isinstance(value, tuple):
        return {TYPE_KEY: "tuple", "items": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and k != TYPE_KEY for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {TYPE_KEY: "dict", "items": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, range):
        return list(value)
    if isinstance(value, float):
        text = _finite(value)
        return value if text is value else {TYPE_KEY: "float", "value": text}
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, (numbers.Number, np.generic)):  # numpy scalars, np.bool_ too
        return encode(value.item())
    raise TypeError(f"Cannot encode a {type(value).__name__} in a result: {value!r}.")


def decode(value: Any) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(TYPE_KEY)
    if kind is None:
        return {k: decode(v) for k, v in value.items()}
    if kind == "Tensor":
        dtype = getattr(torch, value["dtype"])
        data = [_NON_FINITE.get(v, v) for v in value["data"]]
        return torch.tensor(data, dtype=dtype).reshape(value["shape"])
    if kind == "float":
        return _NON_FINITE[value["value"]]
    if kind == "tuple":
        return tuple(decode(v) for v in value["items"])
    if kind == "dict":
        return {decode(k): decode(v) for k, v in value["items"]}
    if kind not in Result.registry:
        raise ValueError(
            f"Unknown result type {kind!r} (known: {', '.join(sorted(Result.registry))}); the "
            "dict was written by another vizkit version or is not a result."
        )
    fields = {k: decode(v) for k, v in value.items() if k != TYPE_KEY}
    return Result.registry[kind](**fields)


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _finite(value: Any) -> Any:
    """Floats as JSON allows them: NaN and infinities as strings (strict JSON has none); inside
    a tensor's data the string alone, elsewhere tagged."""
    if not isinstance(value, float) or math.isfinite(value):
        return value
    text = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return text


def _short(value: Any) -> str:
    """A few characters for one field: tensors by shape and dtype, long lists elided."""
    if isinstance(value, Tensor):
        if value.numel() == 1:
            return f"{value.item():.4g}"
        return f"<{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}>"
    if isinstance(value, list) and (len(value) > _MAX_LIST or len(str(value)) > _MAX_TEXT):
        return f"[{_short(value[0])}, ..., {_short(value[-1])}] ({len(value)})"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, TokenLayout):
        return f"{value.num_prefix_tokens}+{'x'.join(map(str, value.cells))}"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Result):
        return type(value).__name__
    return repr(value)


def _cell(value: Any) -> str:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    return f"{value:.4g}" if isinstance(value, float) else str(value)
