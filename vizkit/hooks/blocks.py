"""Canonical names inside one transformer block, by the block's and the attention's class.

A block is described by where its two residual branches end and where the stream between them
can be read; an attention module by the site of its post-softmax map and what that map is. The
family adapters (`vizkit.hooks.families`) walk a model and call `block_taps` on each block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from timm.layers import Attention, AttentionPoolLatent
from timm.models import (
    beit,
    cait,
    convit,
    crossvit,
    eva,
    hiera,
    levit,
    maxxvit,
    mvitv2,
    twins,
    xcit,
)
from timm.models import swin_transformer as swin
from timm.models import swin_transformer_v2 as swinv2
from timm.models import vision_transformer as vit
from timm.models import vision_transformer_relpos as relpos
from torch import nn

from .beside import BESIDE_CLASSES
from .derived import (
    attention_pool_pattern,
    eva_content_pattern,
    gpsa_content_pattern,
    gpsa_gate,
    gpsa_position_pattern,
    has_position_bias,
    hiera_pattern,
    levit_bias,
    levit_pattern,
    mvit_pattern,
    position_bias,
)
from .taps import GridFn, Tap, heads_last_to_first, nchw_to_nlc, nhwc_to_nlc, windows_to_batch

__all__ = ["ResidualSpec", "attention_taps", "block_taps", "residual_spec", "stream_taps"]


@dataclass(frozen=True)
class ResidualSpec:
    """Where a two-branch residual block's quantities are read (child module names).

    Attributes:
        attn_out: child whose output is what the attention branch adds to the stream.
        mlp_out: the same for the MLP branch (equal to ``attn_out`` when one module serves both,
            as CaiT's and ConViT's shared ``drop_path``: then its first and second call).
        mid: child whose input is the stream between the branches.
    """

    attn_out: str = "drop_path1"
    mlp_out: str = "drop_path2"
    mid: str = "norm2"


# x + drop_path1(.. attn(norm1(x))); x + drop_path2(.. mlp(norm2(x)))
_PRE_NORM = ResidualSpec()
# x + drop_path1(norm1(attn(x))); x + drop_path2(norm2(mlp(x)))
_POST_NORM = ResidualSpec(mid="mlp")
_SHARED_DROP_PATH = ResidualSpec("drop_path", "drop_path", "norm2")

_RESIDUAL_SPECS: dict[type, ResidualSpec] = {
    vit.Block: _PRE_NORM,
    vit.ResPostBlock: _POST_NORM,
    eva.EvaBlock: _PRE_NORM,
    eva.EvaBlockPostNorm: _POST_NORM,
    beit.Block: _PRE_NORM,
    relpos.RelPosBlock: _PRE_NORM,
    relpos.ResPostRelPosBlock: _POST_NORM,
    swin.SwinTransformerBlock: _PRE_NORM,
    swinv2.SwinTransformerV2Block: _POST_NORM,
    twins.Block: _PRE_NORM,
    maxxvit.PartitionAttentionCl: _PRE_NORM,
    cait.LayerScaleBlock: _SHARED_DROP_PATH,
    cait.LayerScaleBlockClassAttn: _SHARED_DROP_PATH,
    convit.Block: _SHARED_DROP_PATH,
    levit.LevitBlock: ResidualSpec(mid="mlp"),  # no norms: x + attn(x); x + mlp(x)
    mvitv2.MultiScaleBlock: _PRE_NORM,
    hiera.HieraBlock: _PRE_NORM,
}


_TUPLE_BLOCKS = (mvitv2.MultiScaleBlock,)  # forward returns (x, feature grid)


def residual_spec(block: nn.Module) -> ResidualSpec | None:
    """The residual layout of ``block``'s class, or None if vizkit does not know it."""
    return _by_class(_RESIDUAL_SPECS, block)


def _by_class(table: dict, module: nn.Module):
    """``table``'s entry for the module's class, else for its nearest known base class
    (subclasses, e.g. vizkit's or a user's, keep the parent's layout)."""
    if type(module) in table:
        return table[type(module)]
    return next((v for t, v in table.items() if isinstance(module, t)), None)


def stream_taps(
    path: str,
    *,
    x_arg: int = 0,
    shape: str = "B N C",
    prefix_tokens: int | None = None,
    grid: GridFn | None = None,
    channels_last: bool = False,
    channels_first: bool = False,
    item: int | None = None,
) -> list[Tap]:
    """Only the ends of the stream: ``hook_resid_pre`` and ``hook_resid_post`` (``item``: of a
    block that returns a tuple)."""
    common = _common(shape, prefix_tokens, grid, channels_last, channels_first)
    return [
        Tap(f"{path}.hook_resid_pre", path, site="input", arg=x_arg, **common),
        Tap(f"{path}.hook_resid_post", path, item=item, **common),
    ]


def block_taps(
    path: str,
    block: nn.Module,
    *,
    x_arg: int = 0,
    shape: str = "B N C",
    prefix_tokens: int | None = None,
    grid: GridFn | None = None,
    channels_last: bool = False,
    input_grid: GridFn | None = None,
    channels_first: bool = False,
) -> list[Tap]:
    """resid_pre/mid/post and both branch outputs of a known block (only the stream ends for an
    unknown one). ``channels_last``/``channels_first``: the stream is (B, gh, gw, C) (Swin) or
    (B, C, gh, gw) (convolutional LeViT), read as (B, Np, C);
    ``input_grid``: the grid of ``hook_resid_pre`` where the block pools (default ``grid``)."""
    spec = residual_spec(block)
    ends = stream_taps(
        path, x_arg=x_arg, shape=shape, prefix_tokens=prefix_tokens, grid=grid,
        channels_last=channels_last, channels_first=channels_first,
        item=0 if isinstance(block, _TUPLE_BLOCKS) else None,
    )  # fmt: skip
    if input_grid is not None:
        ends[0] = dataclasses.replace(ends[0], grid=input_grid)
    if spec is None:
        return ends
    common = _common(shape, prefix_tokens, grid, channels_last, channels_first)
    attn_out, mlp_out = f"{path}.{spec.attn_out}", f"{path}.{spec.mlp_out}"
    shared = attn_out == mlp_out
    scope = {"call_scope": path} if shared else {}
    return [
        ends[0],
        Tap(f"{path}.hook_attn_out", attn_out, call=0 if shared else None, **scope, **common),
        Tap(f"{path}.hook_resid_mid", f"{path}.{spec.mid}", site="input", **common),
        Tap(f"{path}.hook_mlp_out", mlp_out, call=1 if shared else None, **scope, **common),
        ends[1],
    ]


def _common(shape, prefix_tokens, grid, channels_last: bool, channels_first: bool = False):
    layout = nhwc_to_nlc if channels_last else nchw_to_nlc if channels_first else {}
    return {"shape": shape, "prefix_tokens": prefix_tokens, "grid": grid, **layout}


# -- attention maps ------------------------------------------------------------------------


@dataclass(frozen=True)
class _PatternSite:
    """Where an attention class materialises its post-softmax map."""

    kind: str
    leaf: str = "hook_pattern"
    child: str = "attn_drop"  # its output, with fused attention off
    position: bool = False  # has a relative position bias (``hook_pos_bias``)


_PATTERN_SITES: dict[type, _PatternSite] = {
    Attention: _PatternSite("self"),
    eva.EvaAttention: _PatternSite("self"),
    beit.Attention: _PatternSite("self", position=True),
    relpos.RelPosAttention: _PatternSite("self", position=True),
    swin.WindowAttention: _PatternSite("window", position=True),
    swinv2.WindowAttention: _PatternSite("window", position=True),
    twins.LocallyGroupedAttn: _PatternSite("window"),
    twins.GlobalSubSampleAttn: _PatternSite("pooled"),
    maxxvit.AttentionCl: _PatternSite("window", position=True),
    cait.ClassAttn: _PatternSite("class"),
    crossvit.CrossAttention: _PatternSite("cross"),
    xcit.XCA: _PatternSite("channel", leaf="hook_channel_pattern"),
    convit.GPSA: _PatternSite("self"),
    convit.MHSA: _PatternSite("self"),
}

# maps no module passes on: recomputed from the attention module's input (kind, function)
_RECOMPUTED = {
    levit.Attention: ("self", levit_pattern),
    levit.AttentionDownsample: ("pooled", levit_pattern),
    mvitv2.MultiScaleAttention: (None, mvit_pattern),  # "self" or "pooled" by its strides
    hiera.MaskUnitAttention: ("unrolled", hiera_pattern),
}

_SHAPES = {
    "self": "B H {n} {n}",
    "window": "B·nW H w² w²",
    "pooled": "B H {n} Nk",
    "class": "B H 1 N",
    "cross": "B H 1 N'",
    "channel": "B H C/H C/H",
}


def attention_taps(
    path: str, attn: nn.Module, *, tokens: str = "N", prefix_tokens: int | None = None,
    grid: GridFn | None = None, shared_position: bool = False, rotary: bool = False,
) -> list[Tap]:  # fmt: skip
    """The map(s) of attention module ``attn`` at ``path`` (none for unknown classes).

    ``tokens``: the axis letter of its tokens ("N", or "Np" where no prefix token takes part);
    ``shared_position``: the model passes a position bias shared across layers (BEiT);
    ``rotary``: the model rotates queries and keys (EVA's RoPE): add the unrotated content map.
    """
    if isinstance(attn, cait.TalkingHeadAttn):
        shape = f"B H {tokens} {tokens}"
        return [  # the softmax map S at proj_w's input, the mixed map after it
            Tap(f"{path}.hook_pattern", f"{path}.proj_w", site="input", shape=shape,
                prefix_tokens=prefix_tokens, grid=grid, kind="self", **heads_last_to_first),
            Tap(f"{path}.hook_pattern_mixed", f"{path}.attn_drop", shape=shape,
                prefix_tokens=prefix_tokens, grid=grid),
        ]  # fmt: skip
    if isinstance(attn, AttentionPoolLatent):
        return [
            Tap(f"{path}.hook_pattern", path, compute=attention_pool_pattern, kind="pool",
                shape="B H Lq N", prefix_tokens=prefix_tokens, grid=grid),
        ]  # fmt: skip
    if type(attn) in _RECOMPUTED:
        kind, compute = _RECOMPUTED[type(attn)]
        kind = kind or ("pooled" if _mvit_pools(attn) else "self")
        shape = {"self": f"B H {tokens} {tokens}", "pooled": "B H Nq Nk",
                 "unrolled": "B H [nW] Nq Nk"}[kind]  # fmt: skip
        taps = [Tap(f"{path}.hook_pattern", path, compute=compute, kind=kind, shape=shape,
                    prefix_tokens=prefix_tokens, grid=grid)]  # fmt: skip
        if isinstance(attn, (levit.Attention, levit.AttentionDownsample)):
            taps.append(Tap(f"{path}.hook_pos_bias", path, compute=levit_bias, kind="position",
                            shape="H Nq Nk"))  # fmt: skip
        return taps
    site = _by_class(_PATTERN_SITES, attn)
    if site is None or not hasattr(attn, site.child):
        return []
    taps = [
        Tap(
            f"{path}.{site.leaf}",
            f"{path}.{site.child}",
            unfuse=path if hasattr(attn, "fused_attn") else None,
            shape=_SHAPES[site.kind].format(n=tokens),
            prefix_tokens=prefix_tokens,
            grid=grid,
            kind=site.kind,
            beside=path if type(attn) in BESIDE_CLASSES else None,
            **(windows_to_batch if site.kind == "window" else {}),
        )
    ]
    if site.position and (has_position_bias(attn) or shared_position):
        taps.append(
            Tap(f"{path}.hook_pos_bias", path, compute=position_bias, kind="position",
                shape="H Nq Nk" if site.kind == "self" else "H w² w²"),
        )  # fmt: skip
    if rotary and isinstance(attn, eva.EvaAttention):  # RoPE's content term, unrotated
        taps.append(
            Tap(f"{path}.hook_content_pattern", path, compute=eva_content_pattern,
                kind="content", shape=f"B H {tokens} {tokens}", prefix_tokens=prefix_tokens,
                grid=grid),
        )  # fmt: skip
    if isinstance(attn, convit.GPSA):  # the two terms ConViT's gate mixes (d'Ascoli et al. 2021)
        taps += [
            Tap(f"{path}.hook_content_pattern", path, compute=gpsa_content_pattern,
                kind="content", shape=f"B H {tokens} {tokens}", prefix_tokens=prefix_tokens,
                grid=grid),
            Tap(f"{path}.hook_position_pattern", path, compute=gpsa_position_pattern,
                kind="position", shape=f"H {tokens} {tokens}"),
            Tap(f"{path}.hook_gate", path, compute=gpsa_gate, kind="gate", shape="H"),
        ]  # fmt: skip
    return taps


def _mvit_pools(attn: nn.Module) -> bool:
    """Whether an MViTv2 attention pools its queries or keys (Nq or Nk below N)."""
    return any(
        pool is not None and tuple(pool.stride) != (1, 1) for pool in (attn.pool_q, attn.pool_k)
    )
