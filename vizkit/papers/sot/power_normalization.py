"""Singular-value power normalization of SoT (Xie et al. 2022, § 3.3, Eqs. 4-8; its backward:
Supp. C, Corollary 1; GCP's iSQRT: Li et al. 2018, the paper's ref. [23]).

- `svpn`: exact svPN (eq. 5), sum_i lambda_i^alpha u_i v_i^T via a thin SVD, with a backward
  written for square, tall and wide matrices (the paper's Corollary 1 misses a term for wide ones).
- `svpn_approx`: the fast version (eqs. 6-8): power iteration + deflation for the r largest
  singular values, the rest shrunk by the r-th estimate. r = 1: Q / lambda_1_hat^(1 - alpha).
- `isqrt`: the Newton-Schulz matrix square root of the GCP baseline (iSQRT, 3 iterations).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SVPN_EPS", "isqrt", "power_iteration", "svpn", "svpn_approx"]

SVPN_EPS = 1e-5  # the released code's epsilon of the approximate version's denominator


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1] (the paper uses 0 < alpha < 1); got {alpha}.")


class _SVPN(torch.autograd.Function):
    """Q (..., m, n) -> U diag(max(s, eps)^alpha) V^T; the backward of a spectral function of the
    singular values, with divided differences (finite when singular values coincide)."""

    @staticmethod
    def forward(ctx, q: Tensor, alpha: float, eps: float) -> Tensor:
        u, s, vh = torch.linalg.svd(q, full_matrices=False)
        s = s.clamp_min(eps)
        ctx.save_for_backward(u, s, vh)
        ctx.alpha = alpha
        return (u * s.pow(alpha).unsqueeze(-2)) @ vh

    @staticmethod
    def backward(ctx, grad: Tensor):
        u, s, vh = ctx.saved_tensors
        alpha = ctx.alpha
        v = vh.mT
        f = s.pow(alpha)
        si, sj = s.unsqueeze(-1), s.unsqueeze(-2)
        fi, fj = f.unsqueeze(-1), f.unsqueeze(-2)
        close = (si - sj).abs() <= 1e-9 * (si + sj)
        mean_df = alpha * ((si + sj) / 2).pow(alpha - 1.0)
        sym_ratio = torch.where(close, mean_df, (fi - fj) / torch.where(close, 1.0, si - sj))
        skew_ratio = (fi + fj) / (si + sj)
        core = u.mT @ grad @ v  # (..., k, k)
        inner = sym_ratio * (core + core.mT) / 2 + skew_ratio * (core - core.mT) / 2
        dq = u @ inner @ vh
        m, n = grad.shape[-2:]
        scale = f / s  # lambda^(alpha - 1)
        if m > u.shape[-1]:  # tall: the part of the gradient outside span(U)
            outside = grad @ v - u @ core
            dq = dq + (outside * scale.unsqueeze(-2)) @ vh
        if n > v.shape[-1]:  # wide: the part outside span(V)
            outside = grad.mT @ u - v @ core.mT
            dq = dq + u @ (outside * scale.unsqueeze(-2)).mT
        return dq, None, None


def svpn(q: Tensor, alpha: float = 0.5, eps: float = SVPN_EPS) -> Tensor:
    """Exact svPN (eq. 5): the singular values of Q raised to ``alpha``, vectors kept.

    Args:
        q: (..., m, n) matrices, any m and n.
        alpha: the exponent; 1 is the identity, 0 the polar factor U V^T.
        eps: singular values below it count as eps (rank-deficient Q, e.g. fewer tokens than m).

    Returns:
        (..., m, n). Computed in float32 at least (never in half precision).
    """
    _check_alpha(alpha)
    dtype = q.dtype
    work = q if dtype in (torch.float32, torch.float64) else q.float()
    return _SVPN.apply(work, float(alpha), float(eps)).to(dtype)


def power_iteration(q: Tensor, v0: Tensor, num_iter: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Eq. 6: u = Qv / |Qv|, v = Q^T u / |Q^T u|, ``num_iter`` times from v0.

    Args:
        q: (..., m, n); v0: (n,) or (..., n), need not be normalized.

    Returns:
        lambda_hat (...,) = |Q^T u| (= u^T Q v), u (..., m), v (..., n).
    """
    if num_iter < 1:
        raise ValueError(f"num_iter must be at least 1; got {num_iter}.")
    v = v0.expand(*q.shape[:-2], q.shape[-1])
    for _ in range(num_iter):
        u = F.normalize((q @ v.unsqueeze(-1)).squeeze(-1), dim=-1)
        qtu = (q.mT @ u.unsqueeze(-1)).squeeze(-1)
        v = F.normalize(qtu, dim=-1)
    return qtu.norm(dim=-1), u, v


def svpn_approx(
    q: Tensor,
    v0: Tensor,
    alpha: float = 0.5,
    num_sv: int = 1,
    num_iter: int = 1,
    eps: float = SVPN_EPS,
) -> tuple[Tensor, Tensor]:
    """The fast svPN (eq. 8) from the ``num_sv`` = r largest singular values:
    sum_{i<r} l_i^alpha u_i v_i^T + (Q - sum_{i<r} l_i u_i v_i^T) / (l_r^(1 - alpha) + eps).

    Args:
        q: (..., m, n).
        v0: (r, n) start vectors, one per deflation step; a single (n,) vector is reused for every
            step as in the released code, which with ``num_iter`` 1 starts every step after the
            first in the null space of the deflated matrix (eqs. 6-7: the estimates after the first
            are round-off).
        alpha: the exponent; 1 returns Q exactly.
        num_sv, num_iter: the paper's (#sv, #iter); adopted (1, 1).

    Returns:
        normalized (..., m, n) and the estimates lambda_hat (..., r).
    """
    _check_alpha(alpha)
    if num_sv < 1 or num_sv > min(q.shape[-2:]):
        raise ValueError(f"num_sv must be in 1..min(m, n) = {min(q.shape[-2:])}; got {num_sv}.")
    starts = v0.expand(num_sv, -1) if v0.ndim == 1 else v0
    if starts.shape != (num_sv, q.shape[-1]):
        raise ValueError(
            f"v0 must be (n,) or (num_sv, n) = ({num_sv}, {q.shape[-1]}); got {tuple(v0.shape)}."
        )
    residual, kept = q, torch.zeros_like(q)
    lambdas = []
    for k in range(num_sv):
        lam, u, v = power_iteration(residual, starts[k], num_iter)
        lambdas.append(lam)
        if k < num_sv - 1:
            rank_one = lam[..., None, None] * u.unsqueeze(-1) * v.unsqueeze(-2)
            kept = kept + lam.pow(alpha)[..., None, None] * u.unsqueeze(-1) * v.unsqueeze(-2)
            residual = residual - rank_one
    out = kept + residual / (lambdas[-1].pow(1.0 - alpha) + eps)[..., None, None]
    return out, torch.stack(lambdas, dim=-1)


def isqrt(p: Tensor, num_iter: int = 3) -> Tensor:
    """Newton-Schulz square root of SPD matrices (iSQRT, Li et al. 2018): pre-normalize by the
    trace, iterate, post-compensate by sqrt(trace).

    Args:
        p: (..., d, d) symmetric positive (semi-)definite.

    Returns:
        (..., d, d), approximately p^(1/2).
    """
    d = p.shape[-1]
    eye = torch.eye(d, dtype=p.dtype, device=p.device).expand_as(p)
    trace = p.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(1e-12)[..., None, None]
    y, z = p / trace, eye
    for _ in range(num_iter):
        t = 0.5 * (3.0 * eye - z @ y)
        y, z = y @ t, t @ z
    return y * trace.sqrt()
