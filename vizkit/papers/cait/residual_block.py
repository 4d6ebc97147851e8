"""A timm ViT block whose residual branches are scaled by one of CaiT's strategies, with
optional talking-heads attention (timm's `TalkingHeadAttn`)."""

from __future__ import annotations

import torch
from timm.models.cait import TalkingHeadAttn
from timm.models.vision_transformer import Block
from torch import nn

from .residual_scale import ResidualScale

__all__ = ["ResidualBlock", "TalkingHeads", "fixup_init"]


class TalkingHeads(TalkingHeadAttn):
    """timm's `TalkingHeadAttn`, built from a `Block`'s attention arguments (the ones it does not
    have, such as qk_norm, are ignored)."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, **_: object) -> None:  # fmt: skip
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, **_) -> torch.Tensor:
        """(B, N, C) -> (B, N, C); a `Block` passes ``attn_mask``, which talking heads lack."""
        if attn_mask is not None:
            raise ValueError("Talking-heads attention takes no attention mask.")
        return super().forward(x)


class ResidualBlock(Block):
    """timm's pre-norm `Block` with ``ls1``/``ls2`` replaced by `ResidualScale` of ``residual``.

    "rezero" also drops both LayerNorms (Fig. 1(b)). For "fixup", apply `fixup_init` once the
    model's weights are initialised. Everything else, forward included, is timm's.
    """

    def __init__(
        self, dim: int, num_heads: int, *, residual: str = "layerscale", eps: float = 1e-5,
        **kwargs,
    ) -> None:  # fmt: skip
        kwargs.pop("init_values", None)  # the strategy decides
        super().__init__(dim, num_heads, **kwargs)
        self.ls1 = ResidualScale(dim, residual, eps)
        self.ls2 = ResidualScale(dim, residual, eps)
        if not self.ls1.keeps_norm:
            self.norm1, self.norm2 = nn.Identity(), nn.Identity()


@torch.no_grad()
def fixup_init(block: Block, num_blocks: int) -> None:
    """Fixup's initialisation of one block (two layers per branch): the last linear layer of
    each branch at zero, the first scaled by num_blocks^(-1/2)."""
    scale = num_blocks ** (-1 / 2)  # L^(-1/(2m-2)) with m = 2 layers per branch
    block.attn.proj.weight.zero_()
    block.mlp.fc2.weight.zero_()
    for linear in (block.mlp.fc1, getattr(block.attn, "qkv", None)):
        if linear is not None:
            linear.weight.mul_(scale)
