"""Refiner's transform of attention maps (Refiner, Zhou et al. 2021, § 3.2-3.4, Fig. 3; and the
authors' released code): attention expansion H -> rH (1x1 conv), distributed local attention (a
head-wise k x k convolution over each N x N map) and reduction rH -> H, with no softmax afterwards.

``mode="paper"`` is the linear transform the paper describes. ``mode="official"`` adds what the
released code does: BatchNorm + ReLU6 after expansion and convolution, BatchNorm after
reduction, the identity residual (+ A), an adaptive BatchNorm over the H maps and the scale
head_dim^-1/2; expansion is skipped when r = 1. The published ImageNet numbers come from it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...hooks.hook_point import HookPoint
from ...hooks.inputs import check_choice

__all__ = ["CONSTRAINTS", "MODES", "AttentionRefiner"]

MODES = ("paper", "official")
# Table 4: the shape of the local kernel
CONSTRAINTS = {
    "none": "k x k over the N x N matrix (query axis x key axis, flattened token order)",
    "spatial": "k x k over each query's keys laid out on the patch grid; prefix keys pass through",
    "rowcol": "a 1 x k conv along keys plus a k x 1 conv along queries, summed",
}


class AttentionRefiner(nn.Module):
    """Refine attention maps: (B, H, N, N) -> (B, H, N, N), rows no longer summing to 1.

    Args:
        num_heads: H, the maps in and out.
        expansion: r, so rH maps in between (Table 1); 1 keeps H (talking-heads-like mixing).
        kernel_size: k of the local convolution, odd (Fig. 6; 1 is the paper's baseline).
        mode: "paper" (linear) or "official" (the released code's BN/ReLU6/residual).
        constraint: a key of `CONSTRAINTS` (Table 4).
        num_prefix_tokens: prefix tokens before the patches (the "spatial" constraint).
        head_dim: d/H, for the official mode's final scale head_dim^-1/2.
        init: "default" (PyTorch's conv init, as the released code) or "identity" (paper mode:
            stacked identities, delta kernels and averaging, so the output equals the input).

    HookPoints: ``hook_expanded`` (B, rH, N, N) and ``hook_local`` (B, rH, N, N).
    """

    def __init__(
        self,
        num_heads: int,
        expansion: int = 3,
        kernel_size: int = 3,
        mode: str = "paper",
        constraint: str = "none",
        num_prefix_tokens: int = 1,
        head_dim: int = 64,
        init: str = "default",
    ) -> None:
        super().__init__()
        check_choice("mode", mode, MODES)
        check_choice("constraint", constraint, tuple(CONSTRAINTS))
        check_choice("init", init, ("default", "identity"))
        if isinstance(expansion, bool) or not isinstance(expansion, int) or expansion < 1:
            raise ValueError(
                f"expansion must be an integer >= 1 (H' = rH maps); got {expansion!r}."
            )
        if (
            not isinstance(kernel_size, int)
            or isinstance(kernel_size, bool)
            or kernel_size % 2 == 0
        ):
            raise ValueError(
                f"kernel_size must be an odd integer (centred 'same' convolution); got "
                f"{kernel_size!r}. Use 1, 3, 5, ..."
            )
        if init == "identity" and mode != "paper":
            raise ValueError("init='identity' exists for mode='paper' only (official: nonlinear).")
        self.num_heads, self.expansion, self.kernel_size = num_heads, expansion, kernel_size
        self.mode, self.constraint, self.num_prefix_tokens = mode, constraint, num_prefix_tokens
        self.scale = head_dim**-0.5
        hidden = num_heads * expansion
        official = mode == "official"
        skip_expand = official and expansion == 1  # as the released code
        # 1x1 convolutions over the head axis, stored as matrices: W_A (rH, H), W_R (H, rH)
        self.weight_expand = None if skip_expand else nn.Parameter(torch.empty(hidden, num_heads))
        if constraint == "rowcol":
            self.weight_row = nn.Parameter(torch.empty(hidden, 1, 1, kernel_size))
            self.weight_col = nn.Parameter(torch.empty(hidden, 1, kernel_size, 1))
        else:
            self.weight = nn.Parameter(torch.empty(hidden, 1, kernel_size, kernel_size))
        self.weight_reduce = nn.Parameter(torch.empty(num_heads, hidden))
        self.hook_expanded = HookPoint()
        self.hook_local = HookPoint()
        if official:
            self.norm_expand = nn.BatchNorm2d(hidden) if not skip_expand else nn.Identity()
            self.norm_local = nn.BatchNorm2d(hidden)
            self.norm_reduce = nn.BatchNorm2d(num_heads)
            self.norm_adapt = nn.BatchNorm2d(num_heads)
        self._init(init)

    @torch.no_grad()
    def _init(self, init: str) -> None:
        names = ("weight", "weight_row", "weight_col")
        kernels = [getattr(self, n) for n in names if hasattr(self, n)]
        for weight in [*kernels, self.weight_expand, self.weight_reduce]:
            if weight is not None:  # nn.Conv2d's init (fan-in = input channels x kernel area)
                nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        if init == "default":
            return
        eye = torch.eye(self.num_heads)
        self.weight_expand.copy_(eye.repeat(self.expansion, 1))
        self.weight_reduce.copy_(eye.repeat(1, self.expansion) / self.expansion)
        for kernel in kernels:
            kernel.zero_()
        if self.constraint == "rowcol":  # the two branches sum: one delta between them
            self.weight_row[..., self.kernel_size // 2] = 1.0
        else:
            self.weight[..., self.kernel_size // 2, self.kernel_size // 2] = 1.0

    def forward(self, attn: Tensor) -> Tensor:
        """(B, H, N, N) maps -> (B, H, N, N) refined maps."""
        if attn.ndim != 4 or attn.shape[1] != self.num_heads or attn.shape[2] != attn.shape[3]:
            raise ValueError(
                f"Expected attention maps (B, {self.num_heads}, N, N); got {tuple(attn.shape)}."
            )
        official = self.mode == "official"
        y = attn if self.weight_expand is None else _mix_heads(self.weight_expand, attn)
        if official:
            y = F.relu6(self.norm_expand(y))
        y = self.hook_expanded(y)
        y = self.local(y)
        if official:
            y = F.relu6(self.norm_local(y))
        y = _mix_heads(self.weight_reduce, self.hook_local(y))
        if official:
            y = self.norm_adapt(self.norm_reduce(y) + attn) * self.scale
        return y

    def local(self, maps: Tensor) -> Tensor:
        """The head-wise k x k convolution (distributed local attention) of (B, rH, N, N) maps,
        zero padding, shaped by the constraint."""
        pad = self.kernel_size // 2
        groups = maps.shape[1]
        # depthwise convolution is 2-3x faster on CPU in channels-last layout (k 3 and 5, 65 x 65)
        maps = maps.contiguous(memory_format=torch.channels_last)
        if self.constraint == "none":
            return F.conv2d(maps, self.weight, padding=pad, groups=groups)
        if self.constraint == "rowcol":
            along_keys = F.conv2d(maps, self.weight_row, padding=(0, pad), groups=groups)
            along_queries = F.conv2d(maps, self.weight_col, padding=(pad, 0), groups=groups)
            return along_keys + along_queries
        return self._spatial(maps, pad)

    def _spatial(self, maps: Tensor, pad: int) -> Tensor:
        b, m, n, _ = maps.shape
        prefix, patches = maps.split([self.num_prefix_tokens, n - self.num_prefix_tokens], dim=-1)
        side = math.isqrt(patches.shape[-1])
        if side * side != patches.shape[-1]:
            raise ValueError(
                f"constraint='spatial' needs a square patch grid: {n} tokens minus "
                f"{self.num_prefix_tokens} prefix tokens = {patches.shape[-1]} is not a square. "
                "Set num_prefix_tokens to the model's, or use constraint='none'."
            )
        grid = patches.permute(0, 2, 1, 3).reshape(b * n, m, side, side)  # per query: key grid
        grid = F.conv2d(grid, self.weight, padding=pad, groups=m)
        patches = grid.reshape(b, n, m, side * side).permute(0, 2, 1, 3)
        return torch.cat([prefix, patches], dim=-1)

    @torch.no_grad()
    def effective_kernel(self) -> Tensor:
        """The paper mode's whole refiner as one full convolution H -> H (the linear steps
        of Refiner § 3.2-3.4 compose):
        K[o, i] = sum_h W_R[o, h] W_A[h, i] w_h, shape (H, H, k, k)."""
        if self.mode != "paper" or self.constraint != "none":
            raise ValueError(
                "The refiner collapses to one convolution only in mode='paper' with "
                f"constraint='none'; this one has mode={self.mode!r}, "
                f"constraint={self.constraint!r}."
            )
        kernels = self.weight[:, 0]  # (rH, k, k)
        return torch.einsum("oh,hi,hab->oiab", self.weight_reduce, self.weight_expand, kernels)


def _mix_heads(weight: Tensor, maps: Tensor) -> Tensor:
    """A 1x1 convolution over the map axis: (O, I) x (B, I, N, N) -> (B, O, N, N)."""
    return torch.einsum("oi,binm->bonm", weight, maps)
