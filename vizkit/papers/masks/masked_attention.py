"""Self-attention with a learned multiplicative mask on the patch-patch scores (paper eq. 9):
softmax((Q K^T / sqrt(d)) o M) V. `ELMAttention` and `GMMAttention` are its two masks; both have
timm's attention signature, so they drop into a timm ViT.

Prefix tokens (class, register) are not masked: M is applied to the [P:, P:] block only, as the
paper's PiT. The patch grid is ``grid_size`` when set (`MaskedViT` sets it from each input),
else the square root of the patch count.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from ...hooks.hook_point import HookPoint
from ..layers.timm_attention import drop_block_options, query_key_norms
from .attention_masks import PAPER_EPS, ElementwiseMask, GaussianMixtureMask

__all__ = ["ELMAttention", "GMMAttention", "MaskedAttention"]


class MaskedAttention(nn.Module):
    """Multi-head self-attention whose scaled scores are multiplied by ``mask(grid)`` before the
    softmax: (B, N, C) -> (B, N, C).

    Args:
        dim: C. num_heads: H. qkv_bias, qk_norm, attn_drop, proj_drop, norm_layer: as timm's
            `Attention` (the paper's models have qkv_bias=False).
        mask: a module grid -> (Hm, Np, Np), Hm in {1, H}.
        num_prefix_tokens: P, the unmasked tokens before the patches.
        grid_size: (gh, gw) of the patches; None infers a square grid from N - P.

    HookPoints: ``hook_scores`` (B, H, N, N) q.k^T / sqrt(d); ``hook_mask`` (Hm, N, N), ones on
    prefix rows and columns; ``hook_scores_masked`` (B, H, N, N); ``hook_pattern`` (B, H, N, N)
    the softmax.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        *,
        mask: nn.Module,
        num_prefix_tokens: int = 0,
        grid_size: tuple[int, int] | None = None,
        **timm_kwargs,
    ) -> None:
        super().__init__()
        drop_block_options(type(self).__name__, timm_kwargs, dim, num_heads)
        if timm_kwargs:
            raise TypeError(
                f"{type(self).__name__} got unexpected arguments {sorted(timm_kwargs)}."
            )
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.num_prefix_tokens = num_prefix_tokens
        self.grid_size = grid_size
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.q_norm, self.k_norm = query_key_norms(self.head_dim, qk_norm, norm_layer)
        self.mask = mask
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.hook_scores = HookPoint()
        self.hook_mask = HookPoint()
        self.hook_scores_masked = HookPoint()
        self.hook_pattern = HookPoint()

    def patch_grid(self, num_tokens: int) -> tuple[int, int]:
        """(gh, gw) of the patches among ``num_tokens`` tokens."""
        patches = num_tokens - self.num_prefix_tokens
        if self.grid_size is not None:
            if self.grid_size[0] * self.grid_size[1] != patches:
                raise ValueError(
                    f"grid_size {tuple(self.grid_size)} holds {math.prod(self.grid_size)} patches "
                    f"but the input has {patches} (N {num_tokens} - {self.num_prefix_tokens} "
                    "prefix tokens); set grid_size to the input's grid or None for a square one."
                )
            return tuple(self.grid_size)
        side = math.isqrt(patches)
        if side * side != patches:
            raise ValueError(
                f"{num_tokens} tokens less {self.num_prefix_tokens} prefix tokens leave {patches}, "
                "not a square grid. With class or register tokens set num_prefix_tokens (or use "
                "vizkit's MaskedViT, e.g. create_model('vizkit_gmm_vit_tiny', class_token=True, "
                "global_pool='token'), which sets it); for a non-square grid set grid_size."
            )
        return side, side

    def full_mask(self, num_tokens: int) -> Tensor:
        """The mask over all tokens (Hm, N, N): ``mask(grid)`` on the patch block, 1 elsewhere."""
        p = self.num_prefix_tokens
        return F.pad(self.mask(self.patch_grid(num_tokens)), (p, 0, p, 0), value=1.0)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        if attn_mask is not None or is_causal:
            raise ValueError(
                f"{type(self).__name__} takes no attention mask and is not causal: its learned "
                "mask multiplies the scores, so an additive mask would be scaled with them."
            )
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        scores = self.hook_scores((self.q_norm(q) * self.scale) @ self.k_norm(k).transpose(-2, -1))
        mask = self.hook_mask(self.full_mask(n))
        attn = self.hook_pattern(self.hook_scores_masked(scores * mask).softmax(dim=-1))
        out = self.attn_drop(attn) @ v  # (B, H, N, d/H)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


class ELMAttention(MaskedAttention):
    """`MaskedAttention` with an `ElementwiseMask` (one Np x Np matrix per layer, shared by the
    heads; zero at init, so attention starts uniform). ``grid``: the (gh, gw) it is learned for.
    """

    def __init__(self, dim: int, num_heads: int = 8, *args, grid: tuple[int, int], **kwargs):
        super().__init__(
            dim, num_heads, *args, mask=ElementwiseMask(grid), grid_size=grid, **kwargs
        )


class GMMAttention(MaskedAttention):
    """`MaskedAttention` with a `GaussianMixtureMask` of ``num_kernels`` Gaussians, per head or
    shared by the heads (``share_heads``); works on any grid."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        num_kernels: int = 5,
        share_heads: bool = False,
        eps: float = PAPER_EPS,
        official_underflow: bool = False,
        **kwargs,
    ) -> None:
        mask = GaussianMixtureMask(num_heads, num_kernels, share_heads, eps, official_underflow)
        super().__init__(dim, num_heads, *args, mask=mask, **kwargs)
