"""timm's VisionTransformer (ViT, DeiT, DINOv2/v3, SigLIP, ...; Dosovitskiy et al. 2021): blocks
over [prefix, patches], timm's shared ``Attention`` (its map at ``attn_drop``, or computed beside
the fused kernel) and the attention-pooling head ``AttentionPoolLatent`` (SigLIP's MAP head)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from timm.layers import Attention, AttentionPoolLatent
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from timm.models import vision_transformer as vit
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ...hooks.family import BlockSite, Family, FamilyLayout, register_family
from ...hooks.sites import captured, recomputed
from .common import POST_NORM, PRE_NORM, embed_tap, final_norm_taps

__all__ = [
    "attach_beside",
    "attention_pool_pattern",
    "head_prefix_tokens",
    "head_readout",
    "layout",
]


def layout(model: vit.VisionTransformer) -> FamilyLayout:
    blocks = [BlockSite(f"blocks.{i}") for i in range(len(model.blocks))]
    return FamilyLayout(
        "vit", blocks, [embed_tap(), *final_norm_taps(model)],
        head_prefix_tokens=head_prefix_tokens(model), readout=head_readout(model),
    )  # fmt: skip


def head_readout(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """timm's head on a block's tokens: ``forward_head(norm(tokens))`` (the pooling, fc_norm and
    classifier the model's forward applies after its last block)."""
    return lambda tokens: model.forward_head(model.norm(tokens))


def head_prefix_tokens(model: nn.Module) -> int | None:
    """0 where the pooling head is given the patches only (``pool_include_prefix=False``)."""
    return 0 if getattr(model, "pool_include_prefix", True) is False else None


def attach_beside(attn: nn.Module, on_map: Callable[[Tensor], None]) -> list[RemovableHandle]:
    """Hooks that call ``on_map`` with the (B, H, N, N) map of timm's ``Attention`` each time it
    runs, leaving its forward (fused or not) untouched (`vizkit.hooks.beside`): the map is built
    from the normalized queries and keys the kernel gets (hooks on ``q_norm`` and ``k_norm``),
    ``softmax((q · scale) kᵀ + mask)``, as the explicit path computes it.

    Returns:
        the handles to remove.
    """
    seen: dict[str, Any] = {}

    def read_mask(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["mask"] = kwargs.get("attn_mask", args[1] if len(args) > 1 else None)
        seen["causal"] = kwargs.get("is_causal", args[2] if len(args) > 2 else False)

    def read_query(module: nn.Module, args: tuple, output: Tensor) -> None:
        seen["q"] = output

    def make_map(module: nn.Module, args: tuple, k: Tensor) -> None:
        q = seen.pop("q") * attn.scale
        logits = q @ k.transpose(-2, -1)
        bias = resolve_self_attn_mask(k.shape[-2], logits, seen["mask"], seen["causal"])
        on_map(maybe_add_mask(logits, bias).softmax(dim=-1))

    return [
        attn.register_forward_pre_hook(read_mask, with_kwargs=True),
        attn.q_norm.register_forward_hook(read_query),
        attn.k_norm.register_forward_hook(make_map),
    ]


def _beside(attn: nn.Module) -> Callable | None:
    """Only timm's ``Attention`` itself: a subclass may change the forward."""
    return functools.partial(attach_beside, attn) if type(attn) is Attention else None


def attention_pool_pattern(pool: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Lq, N): the latent queries' attention over the tokens of a timm
    `AttentionPoolLatent` (SigLIP's MAP head), recomputed from its input and weights as its
    forward computes it (the module has no ``attn_drop`` to hook)."""
    x = args[0] if args else kwargs["x"]
    mask = kwargs.get("attn_mask", args[1] if len(args) > 1 else None)
    batch, tokens, _ = x.shape
    if pool.pos_embed is not None:
        x = x + pool.pos_embed.unsqueeze(0).to(x.dtype)
    heads, head_dim, latents = pool.num_heads, pool.head_dim, pool.latent_len
    q = pool.q(pool.latent.expand(batch, -1, -1))
    q = q.reshape(batch, latents, heads, head_dim).transpose(1, 2)
    k = pool.kv(x).reshape(batch, tokens, 2, heads, head_dim).permute(2, 0, 3, 1, 4)[0]
    q, k = pool.q_norm(q), pool.k_norm(k)
    logits = (q * pool.scale) @ k.transpose(-2, -1)
    if mask is not None:
        logits = logits + mask
    return logits.softmax(-1)


FAMILY = register_family(
    Family(
        "vit",
        "timm",
        models={vit.VisionTransformer: layout},
        blocks={vit.Block: PRE_NORM, vit.ResPostBlock: POST_NORM},
        attention={
            Attention: captured("self", beside=_beside),
            AttentionPoolLatent: recomputed("pool", attention_pool_pattern, shape="B H Lq N"),
        },
        outside_blocks=(AttentionPoolLatent,),
    )
)
