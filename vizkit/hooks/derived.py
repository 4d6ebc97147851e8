"""Values derived when an attention module runs: its relative position bias, and the map of
attention modules that never materialise it where a hook could read it.

Each function has the signature of `Tap.compute`: ``(module, args, kwargs, output) -> Tensor``.
"""

from __future__ import annotations

from typing import Any

import torch
from timm.models import mvitv2
from torch import Tensor, nn

__all__ = [
    "attention_pool_pattern",
    "biased_attention_pattern",
    "bottleneck_pattern",
    "cascaded_group_pattern",
    "conv_attention_pattern",
    "eva_content_pattern",
    "gpsa_content_pattern",
    "gpsa_gate",
    "gpsa_position_pattern",
    "has_position_bias",
    "hiera_pattern",
    "levit_bias",
    "levit_pattern",
    "mvit_pattern",
    "pooled_query_pattern",
    "position_bias",
    "single_head_pattern",
]

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


# -- ConViT's gated positional self-attention (d'Ascoli et al. 2021, Sec. 3) -----------------


def gpsa_content_pattern(gpsa: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): softmax(q k^T / sqrt(d)), the content term of a ConViT GPSA map."""
    x = args[0]
    batch, tokens, channels = x.shape
    qk = gpsa.qk(x).reshape(batch, tokens, 2, gpsa.num_heads, channels // gpsa.num_heads)
    q, k = qk.permute(2, 0, 3, 1, 4)
    return ((q @ k.transpose(-2, -1)) * gpsa.scale).softmax(-1)


def gpsa_position_pattern(gpsa: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, N, N): softmax of the learned function of the relative positions, the positional
    term of a ConViT GPSA map (the same for every image)."""
    return gpsa.pos_proj(gpsa.rel_indices[0]).permute(2, 0, 1).softmax(-1)


def gpsa_gate(gpsa: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H,): sigmoid(lambda_h), the weight of the positional term in each head's map."""
    return torch.sigmoid(gpsa.gating_param)


# -- maps no hook can read: recomputed from the module's input, as its forward computes them --


def levit_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, Nk): a LeViT ``Attention`` (Nq = Nk) or ``AttentionDownsample`` (queries on
    the subsampled grid) map, softmax(q k^T scale + learned attention biases) (Graham et al.
    2021, Sec. 4.1)."""
    x, heads, dim = args[0], attn.num_heads, attn.key_dim
    batch = x.shape[0]
    if attn.use_conv:  # (B, C, h, w): q and k are (B, H, d, N)
        tokens = x.shape[2] * x.shape[3]
        if hasattr(attn, "kv"):
            k = attn.kv(x).view(batch, heads, -1, tokens)[:, :, :dim]
            q = attn.q(x).view(batch, heads, dim, -1)
        else:
            q, k = attn.qkv(x).view(batch, heads, -1, tokens)[:, :, : 2 * dim].split(dim, dim=2)
        logits = q.transpose(-2, -1) @ k
    else:  # (B, N, C)
        tokens = x.shape[1]
        if hasattr(attn, "kv"):
            k = attn.kv(x).view(batch, tokens, heads, -1)[..., :dim]
            q = attn.q(x).view(batch, -1, heads, dim)
        else:
            qkv = attn.qkv(x).view(batch, tokens, heads, -1)
            q, k = qkv[..., :dim], qkv[..., dim : 2 * dim]
        logits = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)
    return (logits * attn.scale + attn.get_attention_biases(x.device)).softmax(-1)


def levit_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, Nq, Nk): LeViT's learned attention biases, indexed by relative position."""
    return attn.get_attention_biases(args[0].device)


def mvit_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, Nk): an MViTv2 pooling-attention map (Li et al. 2022, Sec. 3.1): queries and
    keys pooled, softmax(q k^T scale + decomposed relative positions)."""
    x = args[0]
    grid = args[1] if len(args) > 1 else kwargs["feat_size"]
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, q_size = _mvit_pooled(attn, qkv[0], grid, attn.pool_q, attn.norm_q)
    k, k_size = _mvit_pooled(attn, qkv[1], grid, attn.pool_k, attn.norm_k)
    logits = (q * attn.scale) @ k.transpose(-2, -1)
    if attn.rel_pos_type == "spatial":
        logits = mvitv2.cal_rel_pos_type(
            logits, q, attn.has_cls_token, q_size, k_size, attn.rel_pos_h, attn.rel_pos_w
        )
    return logits.softmax(-1)


def _mvit_pooled(attn: nn.Module, t: Tensor, grid, pool: nn.Module | None, norm):
    size = grid
    if pool is not None:
        t, token = mvitv2.reshape_pre_pool(t, grid, attn.has_cls_token)
        t, size = mvitv2.reshape_post_pool(pool(t), attn.num_heads, token)
    return (norm(t) if norm is not None else t), size


def hiera_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """A Hiera ``MaskUnitAttention`` map (Ryali et al. 2023, Sec. 3): (B, H, nW, Nq, Nk) inside
    each mask unit, or (B, H, Nq, Nk) for global attention; queries max-pooled where the block
    pools (q_stride > 1). Tokens are in Hiera's unrolled order, not raster order."""
    x = args[0]
    batch, tokens, _ = x.shape
    heads, head_dim, stride = attn.heads, attn.head_dim, attn.q_stride
    if attn.use_mask_unit_attn:
        windows = tokens // (stride * attn.window_size)
        qkv = attn.qkv(x).reshape(batch, -1, windows, 3, heads, head_dim).permute(3, 0, 4, 2, 1, 5)
        q, k = qkv[0], qkv[1]
        if stride > 1:
            q = q.view(batch, heads, windows, stride, -1, head_dim).amax(dim=3)
    else:
        q, k = attn.qkv(x).reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)[:2]
        if stride > 1:
            q = q.view(batch, heads, stride, -1, head_dim).amax(dim=2)
    return ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)


def biased_attention_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): softmax(q k^T scale + learned attention biases) of TinyViT's (after its
    input norm) and EfficientFormer's attention, as their forwards compute it."""
    x = args[0]
    x = attn.norm(x) if hasattr(attn, "norm") else x
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).view(batch, tokens, attn.num_heads, -1).transpose(1, 2)
    q, k = qkv[..., : attn.key_dim], qkv[..., attn.key_dim : 2 * attn.key_dim]
    logits = (q @ k.transpose(-2, -1)) * attn.scale
    return (logits + attn.get_attention_biases(x.device)).softmax(-1)


def pooled_query_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, N): SAM2 Hiera's (``hieradet_sam2``) attention on a (B, h, w, C) map, queries
    max-pooled where the block downsamples."""
    x = args[0]
    batch, height, width, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(batch, height * width, 3, attn.num_heads, -1).unbind(2)
    if attn.q_pool is not None:
        q = attn.q_pool(q.reshape(batch, height, width, -1).permute(0, 3, 1, 2))
        q = q.permute(0, 2, 3, 1).reshape(batch, -1, attn.num_heads, k.shape[-1])
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    return ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)


def conv_attention_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, n, n): LowFormer's and CPUBone's attention over a strided convolutional
    projection of the (B, C, h, w) map (n = the projection's h' w')."""
    x = args[0]
    if getattr(attn, "small_kernels", False) and getattr(attn, "att_stride", 1) > 1:
        stride = attn.att_stride  # CPUBone pads odd sizes before projecting, as its forward
        x = torch.nn.functional.pad(x, (0, (-x.shape[-1]) % stride, 0, (-x.shape[-2]) % stride))
    projected = attn.pwise(attn.conv_proj(x))
    batch, _, height, width = projected.shape
    qkv = projected.reshape(batch, attn.num_heads, attn.num_keys * attn.head_dim, height * width)
    q, k, _ = qkv.permute(0, 1, 3, 2).chunk(3, dim=3)
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)


def single_head_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, 1, N, N): SHViT's single-head attention over the first ``pdim`` channels of the
    (B, C, h, w) map."""
    x1 = attn.pre_norm(args[0][:, : attn.pdim])
    q, k, _ = torch.split(attn.qkv(x1), [attn.qk_dim, attn.qk_dim, attn.pdim], dim=1)
    return ((q.flatten(2).transpose(-2, -1) @ k.flatten(2)) * attn.scale).softmax(-1)[:, None]


def bottleneck_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): BoTNet's bottleneck self-attention over the (B, C, h, w) map, with its
    relative-position logits (``pos_embed``, a function of q)."""
    x = args[0]
    batch, heads = x.shape[0], attn.num_heads
    q, k, _ = torch.split(attn.qkv(x), [attn.dim_out_qk, attn.dim_out_qk, attn.dim_out_v], dim=1)
    q = q.reshape(batch * heads, attn.dim_head_qk, -1).transpose(-1, -2)
    k = k.reshape(batch * heads, attn.dim_head_qk, -1)
    if attn.scale_pos_embed:
        logits = (q @ k + attn.pos_embed(q)) * attn.scale
    else:
        logits = (q @ k) * attn.scale + attn.pos_embed(q)
    return logits.softmax(-1).unflatten(0, (batch, heads))


def cascaded_group_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): EfficientViT's (MSRA) cascaded group attention, one head per channel group,
    each head's input adding the previous head's output (Liu et al. 2023, Eq. 1-2)."""
    x = args[0]
    batch, _, height, width = x.shape
    groups, biases = x.chunk(len(attn.qkvs), dim=1), attn.get_attention_biases(x.device)
    maps, feat = [], groups[0]
    for head, (qkv, dws) in enumerate(zip(attn.qkvs, attn.dws, strict=True)):
        feat = feat + groups[head] if head else feat
        q, k, v = (
            qkv(feat)
            .view(batch, -1, height, width)
            .split([attn.key_dim, attn.key_dim, attn.val_dim], dim=1)
        )
        q, k, v = dws(q).flatten(2), k.flatten(2), v.flatten(2)
        pattern = ((q * attn.scale).transpose(-2, -1) @ k + biases[head]).softmax(-1)
        feat = (v @ pattern.transpose(-2, -1)).view(batch, attn.val_dim, height, width)
        maps.append(pattern)
    return torch.stack(maps, 1)


def eva_content_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): an EVA attention map without its rotary position embedding,
    softmax(q k^T / sqrt(d)) of the unrotated queries and keys: the content term that RoPE
    modulates (the captured ``hook_pattern`` has the rotation)."""
    x = args[0]
    batch, tokens, _ = x.shape
    if attn.qkv is not None:
        bias = None
        if attn.q_bias is not None:
            bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        elif attn.qkv.bias is not None:
            bias = attn.qkv.bias
        qkv = torch.nn.functional.linear(x, attn.qkv.weight, bias)
        q, k, _ = qkv.reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    else:
        q, k = (
            proj(x).reshape(batch, tokens, attn.num_heads, -1).transpose(1, 2)
            for proj in (attn.q_proj, attn.k_proj)
        )
    logits = (attn.q_norm(q) * attn.scale) @ attn.k_norm(k).transpose(-2, -1)
    mask = kwargs.get("attn_mask")
    return (logits if mask is None else logits + mask).softmax(-1)
