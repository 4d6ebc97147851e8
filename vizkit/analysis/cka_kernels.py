"""Centered kernel alignment (Kornblith et al. 2019, "Similarity of Neural Network
Representations Revisited") of two feature matrices.

Each representation of n examples becomes a kernel: the linear Gram matrix ``K = X Xᵀ`` or an RBF
Gram matrix. HSIC between two kernels is estimated either by the biased statistic
``tr(HKHL) / (n-1)²`` or by the unbiased U-statistic of Song et al. 2012 (Eq. 5), the estimator
the minibatch CKA of Nguyen et al. 2021 ("Do Wide and Deep Networks Learn the Same Things?")
averages over batches. CKA normalizes HSIC:
``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))``.

Every kernel is built from centered features: the mean of each feature over the n examples is
subtracted first (``H X`` with the centering matrix ``H = I - 11ᵀ/n`` of Kornblith et al.
2019's HSIC). Both estimators are invariant to a shared offset in exact arithmetic, but a
Gram matrix of raw features with a large offset (a bias) holds the offset's squared norm in every
entry, and the HSIC formulas then cancel it away, losing the signal to rounding. Centering first
keeps CKA of ``x + c`` equal to CKA of ``x`` to rounding. A linear kernel is kept as the centered
features when they are narrower than the number of examples (then ``tr(KL) = ||Xᵀ Y||_F²``
costs n·p² instead of n²·p), otherwise as their Gram matrix ``X Xᵀ``; an RBF kernel takes its
pairwise distances from the centered features too (distances are offset-invariant, but their
matrix-product form is not numerically).

Features that are constant across the examples (equal values for float32 and half features, a
range within n float64 rounding steps of the feature's own magnitude for float64 ones, so
tiny-scale features are not mistaken for constant ones) are set to exactly 0; a representation
whose every feature is constant makes CKA undefined (0/0), and `cka` says so. NaN or Inf
features are refused with the representation's name.

Precision: features arrive in the model's dtype. float64 features are centered and multiplied
in float64; float32 and half features are centered (their means summed in float32) and
multiplied (the linear Gram matrix ``X Xᵀ``) in float32, whose rounding matches what the features
already carry (`_center`). RBF distances, narrow features' products, HSIC and CKA are float64.
The checks stay on the features' device, and `check_kernels` reads the flags of many kernels at
once, so a batch of layers costs one host sync on a GPU, not one per layer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ..hooks.inputs import check_choice, check_number

__all__ = ["KERNELS", "Kernel", "check_kernels", "cka", "cka_from_hsic", "hsic_matrix", "kernel"]

KERNELS = ("linear", "rbf")


@dataclass
class Kernel:
    """One representation's kernel on one batch of n examples: the centered features X (n, p),
    whose Gram matrix is X Xᵀ, or the Gram matrix (n, n) itself (of centered features; build
    kernels with `kernel`).

    ``checks`` holds what `check_kernels` reads, on the kernel's device so that building a kernel
    never waits for the GPU: (6,) int64 = features holding NaN, features holding Inf, every
    feature constant, every feature varying only at the rounding level of the source dtype, RBF
    median distance 0, finite features whose float32 sum over the examples overflows.
    """

    features: Tensor | None = None
    gram: Tensor | None = None
    checks: Tensor | None = None
    name: str = "features"
    width: int = 0  # p, the number of features the kernel was built from
    source: torch.dtype = torch.float64  # the features' dtype before centering

    @property
    def n(self) -> int:
        return len(self.features if self.features is not None else self.gram)

    @property
    def constant(self) -> bool:
        """Every example had the same features (reads the flag: a host sync on a GPU)."""
        return self.checks is not None and bool(self.checks[2])

    def constant_flag(self) -> Tensor:
        """() int64 on the kernel's device: 1 when every example had the same features."""
        if self.checks is not None:
            return self.checks[2]
        data = self.features if self.features is not None else self.gram
        return torch.zeros((), dtype=torch.int64, device=data.device)

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


def kernel(
    x: Tensor,
    kind: str = "linear",
    bandwidth: float = 1.0,
    *,
    name: str = "features",
    check: bool = True,
) -> Kernel:
    """The kernel of features ``x`` (n, p), built from the centered features and held in
    float64 (computed in float32 for float32 or half features; see the module docstring).

    Args:
        x: n examples of p features (any float dtype, any device).
        kind: "linear" or "rbf" (Gaussian, ``exp(-d² / (2 σ²))``).
        bandwidth: for "rbf", σ as a multiple of the median pairwise distance of this batch.
        name: what ``x`` is (a layer's name), for error messages.
        check: refuse or warn now (`check_kernels`); False leaves it to the caller, who checks
            many kernels with one read of their flags.

    Raises:
        ValueError: ``x`` holds NaN or Inf values; for "rbf", the median pairwise distance is 0.
    """
    if kind not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kind!r}.")
    centered, checks = _center(x, name)
    n, p = centered.shape
    found = {"checks": checks, "name": name, "width": p, "source": x.dtype}
    if kind == "linear" and p < n:
        built = Kernel(features=centered.double(), **found)
    elif kind == "linear":
        built = Kernel(gram=(centered @ centered.T).double(), **found)
    else:
        centered = centered.double()  # the distances' matrix-product form cancels
        squared = torch.cdist(centered, centered).square()
        off_diagonal = squared.flatten()[1:].view(n - 1, n + 1)[:, :-1].flatten()  # no sync
        median = _median(off_diagonal)
        zero_median = (median <= 0).to(torch.int64)[None]
        found["checks"] = torch.cat([checks[:4], zero_median, checks[5:]])
        built = Kernel(gram=torch.exp(-squared / (2 * bandwidth**2 * median)), **found)
    if check:
        check_kernels([built])
    return built


def check_kernels(kernels: list[Kernel]) -> None:
    """Refuse kernels of non-finite features or of an undefined RBF bandwidth, and warn about
    features that vary only at rounding level; one host read of all their flags.

    Raises:
        ValueError: the first such kernel, named.
    """
    checked = [k for k in kernels if k.checks is not None]
    if not checked:
        return
    device = checked[0].checks.device
    rows = torch.stack([k.checks.to(device) for k in checked]).tolist()
    for k, (nan, inf, constant, rounding, zero_median, overflow) in zip(checked, rows, strict=True):
        if nan or inf:
            raise ValueError(
                f"{k.name} has NaN values in {nan} and Inf values in {inf} of its {k.width} "
                f"features ({k.n} examples): CKA of non-finite features is undefined. Check the "
                "model and its inputs (e.g. an overflow in reduced precision)."
            )
        if overflow:
            raise ValueError(
                f"{k.name}: {overflow} of its {k.width} {k.source} features are so large that "
                f"their sum over the {k.n} examples overflows float32 (values near "
                f"{torch.finfo(torch.float32).max:.1e} / {k.n}), so they cannot be centered in "
                "float32. Compute in float64 (model.double() and float64 images, or "
                "features.double() for vk.cka), or check the model for an overflow."
            )
        if zero_median:
            raise ValueError(
                f"RBF kernel of {k.name}: the median pairwise distance is 0 (more than half of "
                "the examples have identical features), so the median-heuristic bandwidth is "
                "undefined. Use kernel='linear' or a batch with distinct examples."
            )
        if rounding and not constant:
            warnings.warn(
                f"{k.name} varies across the {k.n} examples only at the rounding level of "
                f"{k.source} (relative range <= 8 eps per feature): its CKA measures rounding "
                "noise. Choose an earlier layer or check that the model is trained.",
                stacklevel=3,
            )


def _center(x: Tensor, name: str = "features") -> tuple[Tensor, Tensor]:
    """``x`` (n, p) with each feature's mean over the n examples subtracted, in float64 for
    float64 features and in float32 otherwise, and its checks (6,) int64 on ``x``'s device (see
    `Kernel`; no host sync).

    A feature counts as constant when its range over the examples is within n float64 rounding
    steps of its magnitude: ``max_i x_ij - min_i x_ij <= n · eps · max_i |x_ij|`` (eps of
    float64; the tolerance kept from the earlier rule, which bounded the deviation from a mean
    summed in float64). The threshold is relative to the feature's own magnitude, so features
    at any scale (``x * 1e-13``) keep their variance; for float32 or half features it means
    equal values. Constant features are set to exactly 0, not to what centering leaves of them.

    For float32 (or half) features the mean is summed and subtracted in float32: its rounding,
    a shared offset of each feature, is of the order of the rounding the features already carry
    and leaves HSIC unchanged (both estimators are invariant to an offset), and a float64 copy
    would cost twice the memory traffic and, on most GPUs, a much slower matrix product. A
    feature whose float32 sum overflows (values near 3.4e38 / n) is flagged for `check_kernels`
    to refuse. The features are read four times (maximum, minimum, sum, and by the subtraction)
    and written once (the centered copy, constant features zeroed in the same pass; one
    `torch.aminmax` for both extremes took about 10x as long as the two reductions on the CPU):
    on a 2-thread CPU, deit_tiny's 12 block outputs at batch 32 (37,824 features) take 1.2 ms
    each, against 2.1 ms when the mean was summed in float64 and the spread read from the
    centered copy.
    """
    if x.ndim != 2:
        raise ValueError(f"{name}: expected features (n examples, p); got {tuple(x.shape)}.")
    x = x.detach()
    n = len(x)
    if not n:
        raise ValueError(f"{name}: no examples (shape {tuple(x.shape)}); CKA needs n >= 2.")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    high, low = x.amax(0).to(work), x.amin(0).to(work)  # (p,); NaN propagates
    magnitude = torch.maximum(high.abs(), low.abs())  # (p,) max |x_j|
    if work == torch.float64:
        flat = high - low <= n * torch.finfo(work).eps * magnitude  # (p,) constant features
        rounding = torch.zeros((), dtype=torch.bool, device=x.device)
    else:  # the tolerance is far below float32's resolution: constant means equal values
        flat = high == low
        rounding = (high - low <= 8 * torch.finfo(x.dtype).eps * magnitude).all()
    keep = (~flat).to(work)  # (p,)
    shift = torch.where(flat, 0, x.mean(0, dtype=work).neg_())  # (p,) -mean, 0 where constant
    centered = torch.addcmul(shift, x, keep)  # (n, p) x·keep - mean·keep in `work`
    no_median = torch.zeros((), dtype=torch.bool, device=x.device)  # set by an RBF `kernel`
    overflow = (shift.isinf() & magnitude.isfinite()).sum()  # a finite feature's sum overflowed
    checks = torch.stack(
        [magnitude.isnan().sum(), magnitude.isinf().sum(), flat.all(), rounding, no_median,
         overflow]
    ).to(torch.int64)  # fmt: skip
    return centered, checks


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
        ValueError: HSIC is NaN or Inf for some representation (non-finite features, or
            features so large that their kernel overflows, in float32 for float32 features); a
            representation's self-HSIC is not positive (constant features, or an unbiased
            estimate from too few examples).
    """
    finite = torch.isfinite(hsic)
    if not finite.all():
        broken = [name for name, ok in zip(names, finite.all(1).tolist(), strict=True) if not ok]
        raise ValueError(
            f"HSIC involving {broken} is NaN or Inf: their kernels hold non-finite values "
            "(NaN/Inf features, or features so large that their kernel overflows, in float32 "
            "for float32 features). Check these layers, or rescale their features."
        )
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

    Raises:
        ValueError: x or y holds NaN or Inf values, or is constant across the examples.
    """
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"{name} must be a tensor (n examples, features); got {type(value).__name__} "
                "(convert arrays with torch.from_numpy)."
            )
        if value.ndim < 2 or len(value) < 2:
            raise ValueError(
                f"{name} must be (n examples, features) with n >= 2; got shape "
                f"{tuple(value.shape)}."
            )
    bandwidth = check_number("bandwidth", bandwidth, 0, low_open=True)
    if len(x) != len(y):
        raise ValueError(
            f"x has {len(x)} examples and y has {len(y)}: CKA compares two representations of "
            "the same examples, so the first dimensions must match."
        )
    check_choice("kernel", kernel, KERNELS)
    kernels = []
    for name, value in (("x", x.flatten(1)), ("y", y.flatten(1))):
        centered, checks = _center(value, name)
        width, source = value.shape[1], value.dtype
        found = Kernel(centered, checks=checks, name=name, width=width, source=source)
        check_kernels([found])
        if found.constant:
            raise ValueError(
                f"{name} has zero variance (every example has the same features), so CKA is "
                "undefined (0/0); check that the representation depends on the input."
            )
        # CKA is invariant to scaling either representation (the RBF bandwidth follows the
        # median distance): unit magnitude keeps HSIC, a 4th power of the features, in range
        centered = centered / centered.abs().max()
        kernels.append(_kernel(centered, kernel, bandwidth, name=name))
    hsic = hsic_matrix(kernels, unbiased)
    return cka_from_hsic(hsic, ["x", "y"], split=1).item()


_kernel = kernel  # `cka` takes a parameter named kernel
