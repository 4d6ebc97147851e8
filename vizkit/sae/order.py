"""The order a sparse autoencoder reads a store's rows in: each epoch the store is cut into
blocks of consecutive rows (one sequential read each, sized by a byte budget), the blocks are
visited in a random order and each block's rows are shuffled in memory. The order is a function
of (seed, epoch) alone, so a resumed run reads exactly the batches it would have read."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from .rows import Rows

__all__ = ["ShuffledBatches"]


class ShuffledBatches:
    """Batches (batch_size, width) of ``store``'s rows, epoch after epoch.

    Each epoch yields ``len(self)`` batches (the rows left over are other rows each epoch);
    a block holds ``block_bytes`` of rows (at least one batch).
    """

    def __init__(self, store: Rows, batch_size: int, seed: int, block_bytes: int) -> None:
        if batch_size > len(store):
            raise ValueError(
                f"batch_size={batch_size}, but there are {len(store)} rows to train on. Pass "
                f"batch_size <= {len(store)}, or store more images."
            )
        self.store, self.batch_size, self.seed = store, batch_size, seed
        row_bytes = store.width * store.dtype.itemsize
        self.block_rows = max(batch_size, block_bytes // row_bytes)

    def __len__(self) -> int:
        return len(self.store) // self.batch_size

    def from_step(self, step: int) -> Iterator[Tensor]:
        """The batches from training step ``step`` on (step 0: the first of epoch 0)."""
        epoch, batch = divmod(step, len(self))
        while True:
            yield from self._epoch(epoch, skip_rows=batch * self.batch_size)
            epoch, batch = epoch + 1, 0

    def _epoch(self, epoch: int, skip_rows: int) -> Iterator[Tensor]:
        rows, size = len(self.store), self.batch_size
        blocks = -(-rows // self.block_rows)
        order = np.random.default_rng([self.seed, epoch]).permutation(blocks)
        position, left, pending = 0, len(self) * size - skip_rows, []
        for block in order:
            start = int(block) * self.block_rows
            stop = min(rows, start + self.block_rows)
            if position + stop - start <= skip_rows:
                position += stop - start
                continue
            shuffled = np.random.default_rng([self.seed, epoch, int(block)]).permutation(
                stop - start
            )
            data = self.store.rows(start, stop)[torch.from_numpy(shuffled)]
            data = data[max(0, skip_rows - position) :]
            position += stop - start
            pending.append(data)
            buffered = torch.cat(pending)
            whole = min(len(buffered), left) // size * size
            for offset in range(0, whole, size):
                yield buffered[offset : offset + size]
            left -= whole
            pending = [buffered[whole:]]
            if left == 0:
                return
