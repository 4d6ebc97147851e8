"""Word-token pooling of SoT's head (SoT, Xie et al. 2022, § 3.2, Eqs. 2-3, Table 2): MGCrP and the
two alternatives of the pooling ablation (Table 3b), GAP and GCP. Each maps tokens (B, q, p)
to (B, out_dim)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...hooks.hook_point import HookPoint
from .power_normalization import SVPN_EPS, isqrt, svpn, svpn_approx

__all__ = ["CENTERINGS", "NORMALIZATIONS", "GlobalAveragePooling", "GlobalCovariancePooling",
           "MGCrP"]  # fmt: skip

NORMALIZATIONS = ("approx", "exact", "none")
CENTERINGS = (None, "scalar", "channel")


def is_hooked(point: HookPoint) -> bool:
    """Whether anything listens to a HookPoint (spectra are computed only for a listener)."""
    return bool(point._forward_hooks or point._forward_pre_hooks)


def _center(x: Tensor, center: str | None) -> Tensor:
    """x (B, h, q, m) -> centred over the tokens: per channel, or by one scalar per (sample,
    head) as the released code's ``Covariance(remove_mean=True)``."""
    if center == "channel":
        return x - x.mean(dim=-2, keepdim=True)
    if center == "scalar":
        return x - x.mean(dim=(-2, -1), keepdim=True)
    return x


class MGCrP(nn.Module):
    """Multi-headed global cross-covariance pooling (eq. 3) with svPN.

    Head i projects the word tokens with W_i (m x p) and R_i (n x p) and pools
    Q_i = (1/q) W_i Z Z^T R_i^T (m x n), then normalizes it; the output is the h normalized
    matrices flattened head-major, row-major: (B, h * m * n).

    Args:
        dim: token size p.
        num_heads, m, n: h and the matrix size; the paper's defaults h = 6, m = n (14 for
            SoT-Tiny, 24 Small, 38 Base). n defaults to m.
        alpha: svPN exponent (Table 4c: 0.5).
        norm: "approx" (eq. 8, the adopted fast version), "exact" (eq. 5 via SVD) or "none".
        num_sv, num_iter: the approximation's (#sv, #iter); adopted (1, 1).
        center: None (the paper's equations), "scalar" (the released code: one mean per sample and
            head over all of X_i) or "channel" (a true cross-covariance).
        v0_init: "learn" (the released code: a learnable N(0, 1) start vector per deflation step)
            or "one" (fixed all ones).
        code_faithful: reuse one start vector for every deflation step, as released (degenerate
            for num_iter 1 and num_sv > 1 in SoT's eqs. 6-7).

    The projection is one bias-free Linear(p, h (m + n)), as released: rows [0, h m) are the W_i,
    the rest the R_i.

    HookPoints: ``hook_cov`` (B, h, m, n) the Q_i; ``hook_sv`` (B, h, min(m, n)) their singular
    values; ``hook_sv_normalized`` (B, h, min(m, n)) those after normalization (spectra are
    computed only when hooked).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 6,
        m: int = 14,
        n: int | None = None,
        alpha: float = 0.5,
        norm: str = "approx",
        num_sv: int = 1,
        num_iter: int = 1,
        center: str | None = None,
        v0_init: str = "learn",
        code_faithful: bool = False,
    ) -> None:
        super().__init__()
        n = m if n is None else n
        if norm not in NORMALIZATIONS:
            raise ValueError(f"norm must be one of {NORMALIZATIONS}; got {norm!r}.")
        if center not in CENTERINGS:
            raise ValueError(f"center must be one of {CENTERINGS}; got {center!r}.")
        if v0_init not in ("learn", "one"):
            raise ValueError(f"v0_init must be 'learn' or 'one'; got {v0_init!r}.")
        if min(num_heads, m, n) < 1 or not 1 <= num_sv <= min(m, n):
            raise ValueError(
                f"Need num_heads, m, n >= 1 and 1 <= num_sv <= min(m, n); got h={num_heads}, "
                f"m={m}, n={n}, num_sv={num_sv}."
            )
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1]; got {alpha}.")
        self.num_heads, self.m, self.n = num_heads, m, n
        self.alpha, self.norm, self.center = alpha, norm, center
        self.num_sv, self.num_iter, self.code_faithful = num_sv, num_iter, code_faithful
        self.out_dim = num_heads * m * n
        self.proj = nn.Linear(dim, num_heads * (m + n), bias=False)
        starts = 1 if code_faithful else num_sv
        if v0_init == "learn":
            self.v0 = nn.Parameter(torch.randn(starts, n))
        else:
            self.register_buffer("v0", torch.ones(starts, n))
        self.hook_cov = HookPoint()
        self.hook_sv = HookPoint()
        self.hook_sv_normalized = HookPoint()

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, m={self.m}, n={self.n}, alpha={self.alpha}, "
                f"norm={self.norm!r}, sv_iter=({self.num_sv}, {self.num_iter}), "
                f"center={self.center!r}")  # fmt: skip

    def projections(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens (B, q, p) -> X (B, h, q, m) and Y (B, h, q, n), centred as configured."""
        b, q, _ = z.shape
        h, m = self.num_heads, self.m
        xy = self.proj(z)
        x = xy[..., : h * m].reshape(b, q, h, m).transpose(1, 2)
        y = xy[..., h * m :].reshape(b, q, h, self.n).transpose(1, 2)
        return _center(x, self.center), _center(y, self.center)

    def covariance(self, z: Tensor) -> Tensor:
        """Tokens (B, q, p) -> Q (B, h, m, n) = (1/q) X_i^T Y_i (X_i as (q, m))."""
        return self.cross_covariance(*self.projections(z))

    def cross_covariance(self, x: Tensor, y: Tensor) -> Tensor:
        """X (B, h, q, m), Y (B, h, q, n) -> Q (B, h, m, n) = (1/q) X^T Y."""
        return self.hook_cov(x.transpose(-1, -2) @ y / x.shape[-2])

    def normalize(self, q: Tensor) -> tuple[Tensor, Tensor | None]:
        """Q (B, h, m, n) -> normalized Q (same shape) and the estimates lambda_hat (B, h, r)
        (approx only, else None)."""
        if self.norm == "exact":
            return svpn(q, self.alpha), None
        if self.norm == "approx":
            v0 = self.v0[0] if self.code_faithful else self.v0  # (n,) reused, or (r, n)
            return svpn_approx(q, v0, self.alpha, self.num_sv, self.num_iter)
        return q, None

    def forward(self, z: Tensor) -> Tensor:
        """Tokens (B, q, p), any q -> (B, h * m * n)."""
        if z.ndim != 3:
            raise ValueError(f"MGCrP takes word tokens (B, q, p); got shape {tuple(z.shape)}.")
        q = self.covariance(z)
        out, _ = self.normalize(q)
        if is_hooked(self.hook_sv):
            self.hook_sv(torch.linalg.svdvals(q.detach().float()))
        if is_hooked(self.hook_sv_normalized):
            self.hook_sv_normalized(torch.linalg.svdvals(out.detach().float()))
        return out.flatten(1)

    def scale(self, q: Tensor) -> Tensor:
        """Q (B, h, m, n) -> the factor c (B, h) with normalized Q = c Q; only for norms that are
        a rescaling: "none" (1) and "approx" with num_sv 1 (1 / (lambda_hat^(1-alpha) + eps))."""
        if self.norm == "exact" or (self.norm == "approx" and self.num_sv > 1):
            raise ValueError(
                f"norm={self.norm!r} with num_sv={self.num_sv} is not a rescaling of Q; the exact "
                "token decomposition needs norm 'none' or 'approx' with num_sv 1 (use Grad-CAM or "
                "captum for the others)."
            )
        if self.norm == "none":
            return q.new_ones(q.shape[:2])
        _, lam = self.normalize(q)
        return 1.0 / (lam[..., -1].pow(1.0 - self.alpha) + SVPN_EPS)


class GlobalAveragePooling(nn.Module):
    """GAP (Table 2): tokens (B, q, p) -> their mean (B, p)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.out_dim = dim

    def forward(self, z: Tensor) -> Tensor:
        return z.mean(dim=1)


class GlobalCovariancePooling(nn.Module):
    """GCP (Table 2): Linear(p, d) -> covariance of the tokens (centred) -> iSQRT square root
    (MPN) -> upper triangle, (B, q, p) -> (B, d (d + 1) / 2).

    Args:
        dim: p. reduced: d; default int(sqrt(2 h m^2)) for h = 6, m = 14 (the released code's
            rule, 48 for SoT), so GCP matches MGCrP's representation size.
        num_iter: Newton-Schulz iterations (3, as released).

    HookPoint ``hook_cov`` (B, d, d): the covariance before the square root.
    """

    def __init__(self, dim: int, reduced: int = 48, num_iter: int = 3) -> None:
        super().__init__()
        self.reduce = nn.Linear(dim, reduced)
        self.num_iter = num_iter
        self.out_dim = reduced * (reduced + 1) // 2
        rows, cols = torch.triu_indices(reduced, reduced)
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)
        self.hook_cov = HookPoint()

    @staticmethod
    def size_for(heads: int, m: int) -> int:
        """The released code's reduced size for h heads of m x m: int(sqrt(2 h m^2))."""
        return int(math.sqrt(2 * heads * m * m))

    def forward(self, z: Tensor) -> Tensor:
        x = self.reduce(z)
        x = x - x.mean(dim=1, keepdim=True)
        cov = self.hook_cov(x.transpose(1, 2) @ x / z.shape[1])
        root = isqrt(cov, self.num_iter)
        return root[:, self._rows, self._cols]
