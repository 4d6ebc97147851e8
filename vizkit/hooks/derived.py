"""Values derived when an attention module runs: its relative position bias, and the map of
attention modules that never materialise it where a hook could read it.

Each function has the signature of `Tap.compute`: ``(module, args, kwargs, output) -> Tensor``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["attention_pool_pattern", "has_position_bias", "position_bias"]

_SHARED_KWARGS = ("shared_rel_pos_bias", "shared_rel_pos")  # BEiT; relpos ViT, MaxViT


def has_position_bias(attn: nn.Module) -> bool:
    """Whether ``attn`` adds a relative position bias of its own to its logits."""
    if getattr(attn, "rel_pos", None) is not None:  # relpos ViT, MaxViT
        return True
    if getattr(attn, "cpb_mlp", None) is not None:  # SwinV2
        return True
    return getattr(attn, "relative_position_bias_table", None) is not None  # BEiT, Swin


def position_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, Nq, Nk): the relative position bias ``attn`` adds to its logits in this call (its own
    table plus a bias shared across layers where one is passed in). For window attention Nq = Nk
    = w², the same for every window.

    Swin V2 (Liu et al. 2022, Sec. 3.3): 16 sigmoid(MLP(log-spaced relative coordinates)),
    recomputed from ``cpb_mlp`` as the module does.
    """
    shared = next((kwargs[k] for k in _SHARED_KWARGS if kwargs.get(k) is not None), None)
    if shared is None and len(args) > 1 and isinstance(args[1], Tensor):
        shared = args[1]
    if getattr(attn, "rel_pos", None) is not None:
        bias = attn.rel_pos.get_bias()
    elif getattr(attn, "cpb_mlp", None) is not None:
        bias = _swinv2_bias(attn)
    elif getattr(attn, "relative_position_bias_table", None) is not None:
        bias = attn._get_rel_pos_bias()
    else:
        bias = None
    if shared is not None:
        bias = shared if bias is None else bias + shared
    if bias is None:
        raise RuntimeError(f"{type(attn).__name__} ran without a position bias to read.")
    return bias.reshape(bias.shape[-3:])


def _swinv2_bias(attn: nn.Module) -> Tensor:
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    area = attn.window_size[0] * attn.window_size[1]
    bias = table[attn.relative_position_index.view(-1)].view(area, area, -1)
    return 16 * torch.sigmoid(bias.permute(2, 0, 1))


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
