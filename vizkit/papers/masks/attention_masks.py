"""Learned multiplicative masks over the patch-patch attention scores ("RetNet Viewed through
Convolution", Li and Zhang 2023, § 3.1-3.3, Eqs. 1-9, Algorithm 1).

A mask module maps the patch grid (gh, gw) to a mask (Hm, Np, Np), Np = gh * gw, Hm = 1 (shared
by the heads) or H; `MaskedAttention` multiplies it into the scaled scores before the softmax.

- `ElementwiseMask` (ELM): one free Np x Np matrix, zero at init (attention starts uniform).
- `GaussianMixtureMask` (GMM): M_ij = sum_k alpha_k exp(-||p_i - p_j||^2 / (2 sigma_k^2 + eps)),
  2 parameters per kernel, for any grid. ``official_underflow=True`` builds it as the released
  code does, ``exp(-d^2 / 2) ** (1 / (sigma^2 + 1e-5))`` in float32, whose base underflows to 0
  for d^2 >= 104 (grids larger than 8 x 8).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ElementwiseMask", "GaussianMixtureMask", "grid_square_distances"]

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
