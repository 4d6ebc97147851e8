"""Minibatch CKA (Nguyen, Raghu & Kornblith 2021, "Do Wide and Deep Networks Learn the Same
Things?"): HSIC of every pair of representations is estimated on each batch and averaged over
batches; CKA is read out from the averages.

Each batch's kernels come from that batch's features centered over the batch (`kernel`). The
unbiased estimator (Song et al. 2012, Eq. 5) is invariant to an offset of the features within
each batch in exact arithmetic, so per-batch centering changes no term of the average; it only
keeps a large offset (a bias) from drowning the estimate in rounding error.

The state is one (M, M) float64 matrix and two counters, whatever the number of examples, and
it sums across processes with ``torch.distributed`` (gloo on CPU, nccl on GPU): processes that
each accumulate a disjoint share of the batches give, after `all_reduce`, the matrix one process
gets from all of them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from ..processes import process_group
from .cka_kernels import Kernel, cka_from_hsic, hsic_matrix

__all__ = ["MinibatchCKA", "distributed_world"]


def distributed_world() -> int:
    """Processes in the default ``torch.distributed`` group (1 when it is not initialized)."""
    return process_group()[0]


class MinibatchCKA:
    """Running mean of per-batch HSIC matrices of the representations ``names``; the kernels
    passed to `update` are those `kernel` builds from each batch's features.

    Example:
        >>> import torch
        >>> from vizkit.analysis.cka_kernels import kernel
        >>> acc = MinibatchCKA(["a", "b"])
        >>> for _ in range(3):  # batches of 16 examples
        ...     xa = torch.randn(16, 8, dtype=torch.float64)
        ...     acc.update([kernel(xa), kernel(2 * xa + 1)])
        >>> acc.cka().allclose(torch.ones(2, 2, dtype=torch.float64))  # invariant to scale, offset
        True
    """

    def __init__(self, names: list[str], unbiased: bool = True) -> None:
        self.names = list(names)
        self.unbiased = unbiased
        self.hsic_sum: Tensor | None = None  # (M, M) float64
        self.batches = 0
        self.examples = 0
        self.varied = torch.zeros(len(self.names))  # batches in which each one was not constant

    def update(self, kernels: list[Kernel]) -> None:
        """Add one batch: the kernels of every representation, in the order of ``names``."""
        if len(kernels) != len(self.names):
            raise ValueError(f"Expected {len(self.names)} kernels, got {len(kernels)}.")
        hsic = hsic_matrix(kernels, self.unbiased)
        self.hsic_sum = hsic if self.hsic_sum is None else self.hsic_sum + hsic
        self.batches += 1
        self.examples += kernels[0].n
        constant = torch.stack([k.constant_flag().to(hsic.device) for k in kernels])
        self.varied = self.varied.to(hsic.device) + (1 - constant)  # stays on the device

    def all_reduce(self, device: torch.device | str | None = None) -> None:
        """Sum the state over the processes of the default group (no-op without one).

        Every process must call this, also one that saw no batch. ``device``: where the
        reduction runs (for nccl, the process's GPU; default: where the state is).
        """
        if distributed_world() == 1:
            return
        m = len(self.names)
        hsic = self.hsic_sum
        if device is None:
            device = hsic.device if hsic is not None else "cpu"
        if hsic is None:
            hsic = torch.zeros(m, m, dtype=torch.float64, device=device)
        counts = torch.tensor([self.batches, self.examples], dtype=torch.float64)
        varied = self.varied.to(device, torch.float64)
        packed = torch.cat([hsic.flatten().to(device), counts.to(device), varied])
        dist.all_reduce(packed)
        self.hsic_sum = packed[: m * m].reshape(m, m)
        self.batches, self.examples = (int(c) for c in packed[m * m : m * m + 2].tolist())
        self.varied = packed[m * m + 2 :]

    def hsic(self) -> Tensor:
        """(M, M) mean HSIC over the batches seen."""
        if not self.batches:
            raise ValueError("No batch was accumulated: the data was empty.")
        return self.hsic_sum / self.batches

    def cka(self, split: int | None = None) -> Tensor:
        """(M, M) CKA, or with ``split`` the block of the first ``split`` names against the
        rest.

        Raises:
            ValueError: a representation was constant in every batch (CKA is 0/0).
        """
        hsic = self.hsic()
        constant = [name for name, v in zip(self.names, self.varied.tolist(), strict=True) if not v]
        if constant:
            raise ValueError(
                f"CKA is undefined for {constant}: their features are constant across the "
                "examples (zero variance) in every batch; check that these layers depend on "
                "the input."
            )
        return cka_from_hsic(hsic, self.names, split)
