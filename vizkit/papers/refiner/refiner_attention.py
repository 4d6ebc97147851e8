"""RefinerAttention: multi-head self-attention whose softmax maps pass through an
`AttentionRefiner` before they aggregate the values (Refiner, Fig. 3). It has timm's attention
signature, so it drops into a timm ViT as ``attn_layer=``.

Attention sharing (Table 13; App. B.4): a block built with ``source=`` has no query/key
projection (its ``v`` projects the values only); it takes the softmax map of the block that
owns the `AttentionRelay` and refines it with its own refiner, as the released Refined-ViT's
"share" blocks do.
"""

from __future__ import annotations

from torch import Tensor, nn

from ...hooks.hook_point import HookPoint
from ..layers.timm_attention import drop_block_options, query_key_norms
from .attention_refiner import AttentionRefiner

__all__ = ["AttentionRelay", "RefinerAttention", "clear_relays"]


class AttentionRelay:
    """Carries one block's softmax map (B, H, N, N) to the blocks that share it (not a module:
    it holds no parameters and is not in the state dict)."""

    def __init__(self) -> None:
        self.map: Tensor | None = None

    def get(self) -> Tensor:
        if self.map is None:
            raise RuntimeError(
                "A sharing block ran before the block whose attention map it reuses: run the "
                "whole model, not the sharing block alone."
            )
        return self.map

    def clear(self) -> None:
        self.map = None


class RefinerAttention(nn.Module):
    """Self-attention with refined maps: (B, N, C) -> (B, N, C).

    Args:
        dim: C. num_heads: H. qkv_bias, qk_norm, attn_drop, proj_drop, norm_layer: as timm's
            `Attention` (norm_layer is the q/k norm).
        refine: pass the maps through an `AttentionRefiner` (False: plain attention, e.g. the
            released model's non-sharing blocks).
        source: the relay of the block whose map this one reuses (None: compute its own).
        **refiner: `AttentionRefiner` options (expansion, kernel_size, mode, constraint,
            num_prefix_tokens, init).

    HookPoints: ``hook_pattern`` (B, H, N, N), the softmax map (row-stochastic; in a sharing
    block the source's); ``hook_pattern_refined`` (B, H, N, N), the map applied to the values,
    not row-stochastic (rollout refuses it unless told); the refiner's ``refiner.hook_expanded``
    and ``refiner.hook_local``.
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
        refine: bool = True,
        source: AttentionRelay | None = None,
        **refiner,
    ) -> None:
        super().__init__()
        drop_block_options("RefinerAttention", refiner, dim, num_heads)
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.source = source
        self.relay: AttentionRelay | None = None  # set when later blocks share this map
        if source is None:
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
            self.q_norm, self.k_norm = query_key_norms(self.head_dim, qk_norm, norm_layer)
        else:
            self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.hook_pattern = HookPoint()
        self.refiner = (
            AttentionRefiner(num_heads, head_dim=self.head_dim, **refiner) if refine else None
        )
        self.hook_pattern_refined = HookPoint() if refine else None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        if attn_mask is not None or is_causal:
            raise ValueError(
                "RefinerAttention takes no attention mask and is not causal: the convolution "
                "over attention maps would spread masked positions."
            )
        b, n, c = x.shape
        if self.source is None:
            qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            logits = (self.q_norm(q) * self.scale) @ self.k_norm(k).transpose(-2, -1)
            attn = self.hook_pattern(logits.softmax(dim=-1))
            if self.relay is not None:
                self.relay.map = attn
        else:
            v = self.v(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
            attn = self.hook_pattern(self.source.get())
        if self.refiner is not None:
            attn = self.hook_pattern_refined(self.refiner(attn))
        out = self.attn_drop(attn) @ v  # (B, H, N, d/H)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def extra_repr(self) -> str:
        return "shares its source's map" if self.source is not None else ""


def clear_relays(model: nn.Module) -> None:
    """Drop the maps the relays of ``model`` hold (they keep the last forward's graph alive)."""
    for module in model.modules():
        if isinstance(module, RefinerAttention) and module.relay is not None:
            module.relay.clear()
