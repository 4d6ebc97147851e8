"""How much memory autograd keeps for a backward pass."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor
from torch.autograd.graph import saved_tensors_hooks

__all__ = ["saved_bytes"]


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn()`` runs (a tensor
    saved by several operations, or views of one storage, count once)."""
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())
