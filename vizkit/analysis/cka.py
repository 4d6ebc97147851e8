"""Centered kernel alignment (Kornblith et al. 2019) of two feature matrices.

Each representation of n examples becomes a kernel: the linear Gram matrix ``K = X Xᵀ`` or an RBF
Gram matrix. HSIC between two kernels is estimated either by the biased statistic
``tr(HKHL) / (n-1)²`` or by the unbiased U-statistic of Song et al. 2012, the estimator the
minibatch CKA of Nguyen et al. 2021 averages over batches. CKA normalizes HSIC:
``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))``.

A linear kernel is kept as the centered features when they are narrower than the number of
examples (then ``tr(KL) = ||Xᵀ Y||_F²`` costs n·p² instead of n²·p), otherwise as the Gram matrix
of the raw features (both estimators are invariant to a shared offset, so centering in feature
space, a full pass over n·p values, is left out). Everything is computed in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["KERNELS", "Kernel", "cka", "cka_from_hsic", "hsic_matrix", "kernel"]

KERNELS = ("linear", "rbf")


@dataclass
class Kernel:
    """One representation's kernel on one batch of n examples: the centered features X (n, p),
    whose Gram matrix is X Xᵀ, or the Gram matrix (n, n) itself."""

    features: Tensor | None = None
    gram: Tensor | None = None
    constant: bool = False  # every example had the same features

    @property
    def n(self) -> int:
        return len(self.features if self.features is not None else self.gram)

    def diagonal(self) -> Tensor:
        """(n,) the kernel's diagonal."""
        if self.gram is not None:
            return self.gram.diagonal()
        return self.features.square().sum(1)

    def row_sums(self) -> Tensor:
        """(n,) K 1."""
        if self.gram is not None:
            return self.gram.sum(1)
        return self.features @ self.features.sum(0)

    def trace_product(self, other: Kernel) -> Tensor:
        """tr(K L) for two kernels on the same examples (scalar)."""
        if self.gram is not None and other.gram is not None:
            return (self.gram * other.gram).sum()
        if self.gram is not None:
            return other.trace_product(self)
        if other.gram is not None:
            return ((other.gram @ self.features) * self.features).sum()
        return (self.features.T @ other.features).square().sum()


def kernel(x: Tensor, kind: str = "linear", bandwidth: float = 1.0) -> Kernel:
    """The kernel of features ``x`` (n, p) in float64.

    Args:
        x: n examples of p features (any float dtype, any device).
        kind: "linear" or "rbf" (Gaussian, ``exp(-d² / (2 σ²))``).
        bandwidth: for "rbf", σ as a multiple of the median pairwise distance of this batch.
    """
    if kind not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kind!r}.")
    x = x.detach().to(torch.float64)
    n, p = x.shape
    if kind == "linear" and p < n:
        centered = x - x.mean(0, keepdim=True)
        return Kernel(features=centered, constant=_negligible(centered, x))
    if kind == "linear":  # HSIC is unchanged by a shared offset, so the Gram needs no centering
        gram = x @ x.T  # all entries equal if and only if all examples are equal
        return Kernel(gram=gram, constant=_negligible(gram - gram[0, 0], gram))
    squared = torch.cdist(x, x).square()
    off_diagonal = squared[~torch.eye(len(x), dtype=torch.bool, device=x.device)]
    median = _median(off_diagonal)
    if median <= 0:
        raise ValueError(
            "RBF kernel: the median pairwise distance is 0 (more than half of the examples "
            "have identical features), so the median-heuristic bandwidth is undefined. Use "
            "kernel='linear' or a batch with distinct examples."
        )
    return Kernel(gram=torch.exp(-squared / (2 * bandwidth**2 * median)))


def _median(values: Tensor) -> Tensor:
    """The median as numpy defines it (mean of the two middle values of an even count)."""
    k = len(values)
    upper = values.kthvalue(k // 2 + 1).values
    return upper if k % 2 else (upper + values.kthvalue(k // 2).values) / 2


def hsic_matrix(kernels: list[Kernel], unbiased: bool) -> Tensor:
    """(M, M) HSIC of every pair of kernels on the same n examples, float64.

    Biased: ``tr(HKHL) / (n-1)²``. Unbiased (Song et al. 2012, Eq. 5), with K̃ the kernel with
    its diagonal set to 0: ``[tr(K̃L̃) + 1ᵀK̃1 1ᵀL̃1 / ((n-1)(n-2)) - 2/(n-2) 1ᵀK̃L̃1] / (n(n-3))``.
    """
    n = kernels[0].n
    if any(k.n != n for k in kernels):
        raise ValueError(f"Kernels on different numbers of examples: {[k.n for k in kernels]}.")
    if unbiased and n < 4:
        raise ValueError(
            f"The unbiased HSIC estimator needs at least 4 examples; got {n}. Use more "
            "examples or unbiased=False."
        )
    traces = _trace_products(kernels)  # (M, M) tr(K L)
    diagonals = torch.stack([k.diagonal() for k in kernels])  # (M, n)
    row_sums = torch.stack([k.row_sums() for k in kernels])  # (M, n)
    if not unbiased:
        totals = row_sums.sum(1)
        centered = traces - 2 / n * row_sums @ row_sums.T + torch.outer(totals, totals) / n**2
        return centered / (n - 1) ** 2
    traces = traces - diagonals @ diagonals.T  # tr(K̃ L̃)
    row_sums = row_sums - diagonals  # K̃ 1
    totals = row_sums.sum(1)  # 1ᵀ K̃ 1
    return (
        traces
        + torch.outer(totals, totals) / ((n - 1) * (n - 2))
        - 2 / (n - 2) * row_sums @ row_sums.T
    ) / (n * (n - 3))


def _trace_products(kernels: list[Kernel]) -> Tensor:
    """(M, M) tr(K_i K_j); Gram matrices as one GEMM of their flattened stack."""
    if all(k.gram is not None for k in kernels):
        flat = torch.stack([k.gram.flatten() for k in kernels])  # (M, n²)
        return flat @ flat.T
    return torch.stack([torch.stack([a.trace_product(b) for b in kernels]) for a in kernels])


def cka_from_hsic(hsic: Tensor, names: list[str], split: int | None = None) -> Tensor:
    """CKA from a joint HSIC matrix (M, M) of the representations ``names``: (M, M), or with
    ``split`` the block of the first ``split`` representations against the rest.

    Raises:
        ValueError: a representation's self-HSIC is not positive (constant features, or an
            unbiased estimate from too few examples).
    """
    self_hsic = hsic.diagonal()
    bad = {
        name: value for name, value in zip(names, self_hsic.tolist(), strict=True) if not value > 0
    }
    if bad:
        raise ValueError(
            f"CKA is undefined for {list(bad)}: their HSIC with themselves is "
            f"{list(bad.values())} (<= 0). Their features are constant across the examples "
            "(zero variance), or the unbiased estimate was taken on too few examples; check "
            "the layer, or use more examples."
        )
    cka = hsic / torch.outer(self_hsic.sqrt(), self_hsic.sqrt())
    return cka if split is None else cka[:split, split:]


def cka(
    x: Tensor, y: Tensor, kernel: str = "linear", unbiased: bool = False, bandwidth: float = 1.0
) -> float:
    """CKA between two representations of the same n examples.

    Args:
        x: (n, p1) features; y: (n, p2) features (higher-rank inputs are flattened per example).
        kernel: "linear" or "rbf" (bandwidth × the median pairwise distance).
        unbiased: the unbiased HSIC estimator (Song et al. 2012) instead of the biased one;
            needs n >= 4.
        bandwidth: RBF σ as a multiple of the median distance.

    Returns:
        CKA in [0, 1] for the biased estimator (the unbiased one can be slightly outside).
    """
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, Tensor) or value.ndim < 2:
            raise ValueError(f"{name} must be a tensor (n examples, features); got {value!r}.")
    if len(x) != len(y):
        raise ValueError(
            f"x has {len(x)} examples and y has {len(y)}: CKA compares two representations of "
            "the same examples, so the first dimensions must match."
        )
    x, y = x.flatten(1), y.flatten(1)
    for name, value in (("x", x), ("y", y)):
        if _is_constant(value):
            raise ValueError(
                f"{name} has zero variance (every example has the same features), so CKA is "
                "undefined (0/0); check that the representation depends on the input."
            )
    kernels = [_kernel(x, kernel, bandwidth), _kernel(y, kernel, bandwidth)]
    hsic = hsic_matrix(kernels, unbiased)
    return cka_from_hsic(hsic, ["x", "y"], split=1).item()


_kernel = kernel  # `cka` takes a parameter named kernel


def _negligible(deviation: Tensor, reference: Tensor) -> bool:
    """Whether ``deviation`` is rounding noise next to ``reference``."""
    return bool(deviation.abs().max() <= 1e-12 * reference.abs().max().clamp(min=1.0))


def _is_constant(x: Tensor) -> bool:
    x = x.detach().to(torch.float64)
    return _negligible(x - x.mean(0, keepdim=True), x)
