"""What an autoencoder trains on: one layer of an `ActivationStore`, or rows the user already
has in memory (a (n, width) tensor: `TensorRows`, read as a store is)."""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from pathlib import Path

from torch import Tensor

from ..store import ActivationStore

__all__ = ["Rows", "TensorRows", "as_rows", "check_finite"]


class TensorRows:
    """A (n, width) tensor with the reading interface of an `ActivationStore`."""

    folder = None
    name = None
    tokens_per_image = 1

    def __init__(self, rows: Tensor) -> None:
        if rows.ndim != 2 or not rows.is_floating_point() or len(rows) == 0:
            raise ValueError(
                "Rows to train on must be a non-empty floating-point (n, width) tensor; got "
                f"{rows.dtype} {tuple(rows.shape)}. Flatten tokens first, e.g. x.flatten(0, 1)."
            )
        self._rows = rows.detach()
        self.width, self.dtype = rows.shape[1], rows.dtype
        self.manifest = {"images": len(rows), "settings": {}}

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self, start: int, stop: int) -> Tensor:
        return self._rows[start:stop]

    def batches(self, batch_size: int) -> Iterator[Tensor]:
        for start in range(0, len(self), batch_size):
            yield self._rows[start : start + batch_size]


Rows = ActivationStore | TensorRows


def as_rows(
    source: ActivationStore | TensorRows | str | Path | Tensor, layer: str | int | None
) -> Rows:
    """``source`` as rows to read: a store (or its folder) at ``layer`` (a hook name, or an
    int counting the stored layers, negative from the end), or a tensor's rows."""
    if isinstance(source, Tensor):
        if layer is not None:
            raise ValueError("layer names a stored layer; rows given as a tensor have none.")
        return TensorRows(source)
    if isinstance(source, TensorRows):
        return source
    store = source if isinstance(source, ActivationStore) else ActivationStore(source)
    if isinstance(layer, numbers.Integral) and not isinstance(layer, bool):
        stored = list(store.manifest["layers"])
        if not -len(stored) <= layer < len(stored):
            valid = f"0..{len(stored) - 1} or -{len(stored)}..-1, or a name"
            raise ValueError(
                f"layer={layer}: the store holds {len(stored)} layers {stored} (valid: {valid})."
            )
        layer = stored[layer]
    return store if layer is None or layer == store.name else store.layer(layer)


def check_finite(rows: Rows, block: int) -> None:
    """Refuse rows holding NaN or inf (an autoencoder trained on them turns all NaN), naming
    the first such row; read ``block`` rows at a time."""
    for start in range(0, len(rows), block):
        finite = rows.rows(start, start + block).isfinite().all(1)
        if not finite.all():
            first = start + int((~finite).nonzero()[0])
            where = "" if rows.folder is None else f" of {rows.folder} ({rows.name})"
            raise ValueError(
                f"Row {first}{where} holds NaN or inf, and {int((~finite).sum())} of rows "
                f"{start}..{min(start + block, len(rows)) - 1} do; an autoencoder trained on "
                "them turns all NaN. Train on finite rows: rows[rows.isfinite().all(1)] for a "
                "tensor, or write the store again with vk.cache_activations (it refuses "
                "non-finite activations, naming the images)."
            )


def rows_source(rows: Rows) -> dict:
    """What an autoencoder of ``rows`` is tied to: the store, layer, tokens, model and data
    (empty for rows given as a tensor)."""
    if isinstance(rows, TensorRows):
        return {}
    stored = rows.manifest["settings"]
    keep = ("model", "tokens", "image_size", "preprocessing", "data", "seed")
    return {"store": str(rows.folder), "layer": rows.name, **{k: stored[k] for k in keep}}
