"""ActivationCache: the read-only result of `HookedModel.run_with_cache`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor

from .layout import TokenLayout
from .names import resolve_names
from .selector import resolve_negative_indices, unknown_name_error

__all__ = ["ActivationCache"]


class ActivationCache(Mapping[str, Tensor]):
    """Captured activations by canonical name, in the order they fired (forward order).

    Keys are canonical hook names (see `vizkit.hooks.adapters` for the table of names and shapes);
    gradients, when requested, follow under ``<name>_grad`` with the activation's shape.
    Negative layer indices resolve at lookup: ``cache["blocks.-1.attn.hook_pattern"]``.

    Attributes:
        layout: token layout of the input that produced the cache (prefix tokens, patch grid),
            or None for models without patch tokens.
    """

    def __init__(
        self,
        data: Mapping[str, Tensor],
        model_names: Sequence[str],
        layout: TokenLayout | None = None,
    ) -> None:
        self._data = dict(data)
        self._model_names = list(model_names)
        self.layout = layout

    def __getitem__(self, name: str) -> Tensor:
        if name in self._data:
            return self._data[name]
        base, grad = (name[:-5], "_grad") if name.endswith("_grad") else (name, "")
        resolved = resolve_negative_indices(base, self._model_names) + grad
        if resolved in self._data:
            return self._data[resolved]
        if resolved.removesuffix("_grad") in self._model_names:
            raise KeyError(
                f"{resolved!r} is a valid name but was not captured: add it to names= "
                f"(and pass grads=True for '_grad' names). Captured: {list(self._data)}"
            )
        raise unknown_name_error(resolved, list(self._data), what="cached name")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        lines = [f"  {k}: {tuple(v.shape)}" for k, v in self._data.items()]
        return "ActivationCache(\n" + "\n".join(lines) + "\n)"

    def select(self, pattern: str | re.Pattern) -> ActivationCache:
        """A cache with the entries whose names match ``pattern``.

        A pattern without glob characters and without a layer index is a leaf
        (``"attn.hook_pattern"`` selects ``blocks.{i}.attn.hook_pattern`` for every i).
        """
        names = list(self._data)
        if isinstance(pattern, str) and not (set("*?[") & set(pattern)) and pattern not in names:
            leaf = pattern
            chosen = [n for n in names if n == leaf or n.endswith("." + leaf)]
            if not chosen:
                raise unknown_name_error(leaf, names, what="cached name")
        else:
            chosen = resolve_names(pattern, names)
        return ActivationCache({n: self._data[n] for n in chosen}, self._model_names, self.layout)

    def stack(self, pattern: str | re.Pattern) -> Tensor:
        """Stack the selected entries along a new leading axis, in forward order.

        ``cache.stack("attn.hook_pattern")`` -> (L, B, H, N, N).

        Raises:
            ValueError: if the selected entries have different shapes (CaiT's self- and
                class-attention patterns); narrow the pattern (``"blocks.*.attn.hook_pattern"``).
        """
        selected = self.select(pattern)
        shapes = {n: tuple(t.shape) for n, t in selected.items()}
        if len(set(shapes.values())) > 1:
            listing = ", ".join(f"{n} {s}" for n, s in shapes.items())
            raise ValueError(
                f"stack({pattern!r}) selected tensors of different shapes: {listing}. "
                "Narrow the pattern (e.g. 'blocks.*.attn.hook_pattern')."
            )
        return torch.stack(list(selected.values()))

    def to(self, device: torch.device | str) -> ActivationCache:
        """A copy with every tensor on ``device``."""
        moved = {n: t.to(device) for n, t in self._data.items()}
        return ActivationCache(moved, self._model_names, self.layout)
