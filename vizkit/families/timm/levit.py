"""LeViT (Graham et al. 2021): a stride-16 stem, then stages whose downsampling attention
halves the grid (r -> (r - 1) // 2 + 1); no prefix tokens, no norms in the residual blocks
(x + attn(x); x + mlp(x)). The maps (softmax(q kᵀ scale + learned attention biases), Sec. 4.1)
are never handed to a child module, so they are recomputed from the attention's input."""

from __future__ import annotations

from typing import Any

from timm.models import levit
from torch import Tensor, nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.sites import recomputed
from ..grids import divided, halved

__all__ = ["layout", "levit_bias", "levit_pattern"]


def layout(model: levit.Levit) -> FamilyLayout:
    blocks, halvings = [], 0
    for s, stage in enumerate(model.stages):
        halvings += not isinstance(stage.downsample, nn.Identity)
        grid = halved(divided(model.stem.stride), halvings)
        blocks += [
            BlockSite(f"stages.{s}.blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid,
                      channels_first=model.use_conv)
            for i in range(len(stage.blocks))
        ]  # fmt: skip
    return FamilyLayout("levit", blocks, [])


def levit_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, Nk): a LeViT ``Attention`` (Nq = Nk) or ``AttentionDownsample`` (queries on
    the subsampled grid) map, softmax(q k^T scale + learned attention biases)."""
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


FAMILY = register_family(
    Family(
        "levit",
        "timm",
        models={levit.Levit: layout},
        blocks={levit.LevitBlock: ResidualSpec(mid="mlp")},
        attention={
            levit.Attention: recomputed("self", levit_pattern, position=levit_bias),
            levit.AttentionDownsample: recomputed("pooled", levit_pattern, position=levit_bias),
        },
        outside_blocks=(levit.AttentionDownsample,),
    )
)
