"""Learned multiplicative masks over the patch-patch attention scores ("RetNet Viewed through
Convolution", Li and Zhang 2023, § 3.1-3.3, Eqs. 1-9, Algorithm 1).

A mask module maps the patch grid (gh, gw) to a mask (Hm, Np, Np), Np = gh * gw, Hm = 1 (shared
by the heads) or H; `MaskedAttention` multiplies it into the scaled scores before the softmax.

- `ElementwiseMask` (ELM): one free Np x Np matrix, zero at init (attention starts uniform).
- `GaussianMixtureMask` (GMM): M_ij = sum_k alpha_k exp(-||p_i - p_j||^2 / (2 sigma_k^2 + eps)),
  2 parameters per kernel, for any grid. ``official_underflow=True`` builds it as the released
  code does, ``exp(-d^2 / 2) ** (1 / (sigma^2 + 1e-5))`` in float32, whose base underflows to 0
  for d^2 >= 104 (grids larger than 8 x 8).

The paper's starting point (§ 1 and Fig. 2) is RetNet's explicit distance decay seen as a
convolution. These masks bring the decays it compares with onto the same footing:

- `DecayMask`: RetNet's causal decay D_nm = gamma^(n - m) for n >= m, else 0, over the patches
  in raster order (Sun et al. 2023, "Retentive Network", its parallel form), or RMT's
  two-dimensional Manhattan decay gamma^(|dx| + |dy|) (Fan et al. 2023, "RMT: Retentive
  Networks Meet Vision Transformers", its Manhattan self-attention); one gamma per head,
  RetNet's 1 - 2^(-5 - h) by default, fixed or learned.
- `LocalMask`: 1 within a (2r + 1) x (2r + 1) neighbourhood of patches, 0 outside (Fig. 2 (d)).

Each of these and the GMM depends on the offset between patches only, so its row for patch i is
the window of one kernel over the offset lattice (``kernel``) centred on patch i: a depthwise
convolution's kernel, re-weighted by the attention scores it multiplies.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "DecayMask",
    "ElementwiseMask",
    "GaussianMixtureMask",
    "LocalMask",
    "grid_square_distances",
    "offsets",
    "retnet_gammas",
]

PAPER_EPS = 2e-5  # the released code's 1e-5 on sigma^2, doubled by its exp(-d^2 / 2) base


def grid_square_distances(grid: tuple[int, int], device=None) -> Tensor:
    """Squared Euclidean distance between the patches of a (gh, gw) grid in row-major order:
    (Np, Np), integer-valued float32."""
    gh, gw = grid
    rows, cols = torch.meshgrid(
        torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij"
    )
    rows, cols = rows.flatten(), cols.flatten()
    return ((rows[:, None] - rows) ** 2 + (cols[:, None] - cols) ** 2).float()


class ElementwiseMask(nn.Module):
    """ELM: a learnable (Np, Np) mask for a fixed grid, shared by the heads; grid -> (1, Np, Np).

    Zero at init, so the masked scores are all 0 and attention is exactly uniform (the paper's
    code; not vanilla attention).
    """

    def __init__(self, grid: tuple[int, int]) -> None:
        super().__init__()
        self.grid = tuple(grid)
        n = self.grid[0] * self.grid[1]
        self.mask = nn.Parameter(torch.zeros(n, n))

    def forward(self, grid: tuple[int, int]) -> Tensor:
        if tuple(grid) != self.grid:
            raise ValueError(
                f"This ELM mask was learned for a {self.grid[0]} x {self.grid[1]} patch grid; "
                f"the input has a {grid[0]} x {grid[1]} grid. An element-wise mask is tied to "
                f"its grid: feed images of the training size, or use GMM attention, whose mask "
                "is a function of patch offsets and works on any grid."
            )
        return self.mask[None]

    def extra_repr(self) -> str:
        return f"grid={self.grid}"


class GaussianMixtureMask(nn.Module):
    """GMM: K isotropic Gaussians over patch offsets; grid -> (Hm, Np, Np), Hm = H or 1.

    Args:
        num_heads: H. num_kernels: K (paper default 5).
        share_heads: one (alpha, sigma) set for all heads (2K parameters; the paper's Tables
            2-4 and 6) instead of one per head (2KH; its text, Table 5 and the released code).
        eps: the epsilon in 2 sigma^2 + eps.
        official_underflow: build the mask as the released code does (see the module doc).

    Parameters ``alpha`` and ``sigma`` (K, Hm), initialised as the paper: N(0, 2^2), N(10, 10^2).
    """

    def __init__(
        self,
        num_heads: int,
        num_kernels: int = 5,
        share_heads: bool = False,
        eps: float = PAPER_EPS,
        official_underflow: bool = False,
    ) -> None:
        super().__init__()
        if num_kernels < 1:
            raise ValueError(f"num_kernels must be >= 1; got {num_kernels}.")
        heads = 1 if share_heads else num_heads
        self.eps, self.official_underflow = eps, official_underflow
        self.alpha = nn.Parameter(torch.randn(num_kernels, heads) * 2)
        self.sigma = nn.Parameter(torch.randn(num_kernels, heads) * 10 + 10)

    def forward(self, grid: tuple[int, int]) -> Tensor:
        d2 = grid_square_distances(grid, self.alpha.device)  # (Np, Np)
        sigma = self.sigma[..., None, None]  # (K, Hm, 1, 1)
        if self.official_underflow:  # exp(-d^2 / 2) ** (1 / (sigma^2 + 1e-5)), in float32
            base = torch.exp(-d2.float()) ** 0.5
            kernels = base.to(sigma.dtype) ** (1 / (sigma**2 + self.eps / 2))
            return (self.alpha[..., None, None] * kernels).sum(0)
        return self._mixture(d2)

    def kernel(self, grid: tuple[int, int]) -> Tensor:
        """The mixture on the offset lattice (Hm, 2gh - 1, 2gw - 1), centre = offset (0, 0);
        row i of the mask is the window of it centred on patch i (paper Fig. 1)."""
        gh, gw = grid
        dr = torch.arange(-(gh - 1), gh, device=self.alpha.device)
        dc = torch.arange(-(gw - 1), gw, device=self.alpha.device)
        return self._mixture(dr[:, None] ** 2 + dc[None] ** 2)

    def _mixture(self, d2: Tensor) -> Tensor:
        """sum_k alpha_k exp(-d2 / (2 sigma_k^2 + eps)) for squared distances (a, b): (Hm, a, b)."""
        sigma = self.sigma[..., None, None]  # (K, Hm, 1, 1)
        gauss = torch.exp(-d2.to(sigma.dtype) / (2 * sigma**2 + self.eps))
        return (self.alpha[..., None, None] * gauss).sum(0)

    def extra_repr(self) -> str:
        k, h = self.alpha.shape
        underflow = self.official_underflow
        return f"num_kernels={k}, heads={h}, eps={self.eps}, official_underflow={underflow}"


def offsets(grid: tuple[int, int], device=None) -> tuple[Tensor, Tensor]:
    """Row and column offsets (key - query) between the patches of a (gh, gw) grid in
    row-major order: two (Np, Np) integer tensors."""
    gh, gw = grid
    rows, cols = torch.meshgrid(
        torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij"
    )
    rows, cols = rows.flatten(), cols.flatten()
    return rows[None] - rows[:, None], cols[None] - cols[:, None]


def _lattice(grid: tuple[int, int], device=None) -> tuple[Tensor, Tensor]:
    """The offset lattice (2gh - 1, 2gw - 1): row and column offsets, centre (0, 0)."""
    gh, gw = grid
    dr = torch.arange(-(gh - 1), gh, device=device)
    dc = torch.arange(-(gw - 1), gw, device=device)
    return dr[:, None].expand(-1, len(dc)), dc[None].expand(len(dr), -1)


def retnet_gammas(num_heads: int) -> Tensor:
    """RetNet's multi-scale decays, gamma_h = 1 - 2^(-5 - h) for heads h = 0 .. H - 1."""
    return 1 - 2.0 ** (-5 - torch.arange(num_heads, dtype=torch.float64, device="cpu"))


class DecayMask(nn.Module):
    """gamma^distance per head: grid -> (H, Np, Np).

    Args:
        num_heads: H, one gamma each.
        kind: "causal" (RetNet: distance n - m in raster order, 0 where m > n) or "manhattan"
            (RMT: |dx| + |dy|, two-sided).
        gammas: (H,) in (0, 1); default `retnet_gammas`.
        learnable: learn gamma (as the logit of a sigmoid, so it stays in (0, 1)); else fixed.
    """

    KINDS = ("causal", "manhattan")

    def __init__(
        self, num_heads: int, kind: str = "manhattan", gammas: Tensor | None = None,
        learnable: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"kind must be 'causal' or 'manhattan'; got {kind!r}.")
        # checked on the CPU, also when the model is built on the meta device (param_count)
        gammas = retnet_gammas(num_heads) if gammas is None else torch.as_tensor(gammas).cpu()
        if gammas.shape != (num_heads,) or not bool(((gammas > 0) & (gammas < 1)).all()):
            raise ValueError(f"gammas must be {num_heads} values in (0, 1); got {gammas}.")
        self.kind = kind
        logit = torch.logit(gammas.double()).float()
        if learnable:
            self.gamma_logit = nn.Parameter(logit)
        else:
            self.register_buffer("gamma_logit", logit)

    @property
    def gammas(self) -> Tensor:
        """(H,) the decays."""
        return torch.sigmoid(self.gamma_logit)

    def _decay(self, dr: Tensor, dc: Tensor, width: int) -> Tensor:
        """(H, *dr.shape) gamma^distance for row and column offsets (key - query)."""
        if self.kind == "manhattan":
            distance, keep = dr.abs() + dc.abs(), torch.ones_like(dr, dtype=torch.bool)
        else:  # n - m in raster order: the key m at or before the query n
            distance = -(dr * width + dc)
            keep = distance >= 0
        log_gamma = torch.nn.functional.logsigmoid(self.gamma_logit)[:, None, None]
        decay = torch.exp(log_gamma * distance.clamp_min(0).to(log_gamma.dtype))
        return decay * keep

    def forward(self, grid: tuple[int, int]) -> Tensor:
        dr, dc = offsets(grid, self.gamma_logit.device)
        return self._decay(dr, dc, grid[1])

    def kernel(self, grid: tuple[int, int]) -> Tensor:
        """(H, 2gh - 1, 2gw - 1) on the offset lattice (key - query), centre = offset (0, 0):
        row i of the mask is its window centred on patch i."""
        dr, dc = _lattice(grid, self.gamma_logit.device)
        return self._decay(dr, dc, grid[1])

    def extra_repr(self) -> str:
        learned = isinstance(self.gamma_logit, nn.Parameter)
        return f"kind={self.kind}, heads={len(self.gamma_logit)}, learnable={learned}"


class LocalMask(nn.Module):
    """1 where the key is within ``radius`` patches of the query in both directions, else 0:
    grid -> (1, Np, Np), fixed (the paper's Fig. 2 (d), local attention in 2-D)."""

    def __init__(self, radius: int = 1) -> None:
        super().__init__()
        if radius < 0:
            raise ValueError(f"radius must be >= 0; got {radius}.")
        self.radius = radius

    def forward(self, grid: tuple[int, int]) -> Tensor:
        dr, dc = offsets(grid)
        return self._window(dr, dc)

    def kernel(self, grid: tuple[int, int]) -> Tensor:
        """(1, 2gh - 1, 2gw - 1) on the offset lattice, as `DecayMask.kernel`."""
        return self._window(*_lattice(grid))

    def _window(self, dr: Tensor, dc: Tensor) -> Tensor:
        return ((dr.abs() <= self.radius) & (dc.abs() <= self.radius)).float()[None]

    def extra_repr(self) -> str:
        return f"radius={self.radius}"
