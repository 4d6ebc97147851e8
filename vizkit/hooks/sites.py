"""Canonical names inside one block, built from what its family registered: the residual stream
and branches of a block (`block_taps`), and the map of an attention module, captured where the
module materialises it (`captured`) or recomputed from its input (`recomputed`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torch import nn

from .attention_mode import unfused_attention
from .family import AttentionContext, AttentionSite, BlockSite, residual_spec
from .readers import (
    Compute,
    ComputedReader,
    ExplicitPathReader,
    InputReader,
    NthCall,
    OutputReader,
    Reader,
)
from .taps import Tap, nchw_to_nlc, nhwc_to_nlc, windows_to_batch

__all__ = ["MAP_SHAPES", "block_taps", "captured", "recomputed", "stream_taps", "unfused_child"]

# the canonical shape of each map kind (``{n}``: the block's token letter)
MAP_SHAPES = {
    "self": "B H {n} {n}",
    "window": "B·nW H w² w²",
    "pooled": "B H {n} Nk",
    "class": "B H 1 N",
    "cross": "B H 1 N'",
    "channel": "B H C/H C/H",
}


def stream_taps(path: str, site: BlockSite, item: int | None = None) -> list[Tap]:
    """Only the ends of the stream: ``hook_resid_pre`` and ``hook_resid_post`` (``item``: of a
    block that returns a tuple)."""
    common = _common(site)
    pre = Tap(f"{path}.hook_resid_pre", path, InputReader(site.x_arg), **common)
    if site.input_grid is not None:
        pre = dataclasses.replace(pre, grid=site.input_grid)
    return [pre, Tap(f"{path}.hook_resid_post", path, OutputReader(item), **common)]


def block_taps(site: BlockSite, block: nn.Module) -> list[Tap]:
    """resid_pre/mid/post and both branch outputs of a block whose family registered its
    `ResidualSpec` (only the stream ends for an unknown block class)."""
    spec = residual_spec(block)
    path = site.path
    ends = stream_taps(path, site, item=site.output_item if spec is None else spec.output_item)
    if spec is None:
        return ends
    common = _common(site)
    attn_out, mlp_out = f"{path}.{spec.attn_out}", f"{path}.{spec.mlp_out}"
    shared = attn_out == mlp_out  # one module run twice (CaiT's drop_path): its calls 0 and 1
    branch: list[Reader] = (
        [NthCall(0, block), NthCall(1, block)] if shared else [OutputReader(), OutputReader()]
    )
    return [
        ends[0],
        Tap(f"{path}.hook_attn_out", attn_out, branch[0], **common),
        Tap(f"{path}.hook_resid_mid", f"{path}.{spec.mid}", InputReader(), **common),
        Tap(f"{path}.hook_mlp_out", mlp_out, branch[1], **common),
        ends[1],
    ]


def _common(site: BlockSite) -> dict:
    layout = nhwc_to_nlc if site.channels_last else nchw_to_nlc if site.channels_first else {}
    layout = site.token_order or layout
    return {"shape": f"B {site.tokens} C", "prefix_tokens": site.prefix_tokens,
            "grid": site.grid, **layout}  # fmt: skip


def captured(
    kind: str,
    *,
    child: str = "attn_drop",
    leaf: str = "hook_pattern",
    position: Compute | None = None,
    has_position: Callable[[nn.Module, AttentionContext], bool] | None = None,
    beside: Callable[[nn.Module], Callable | None] | None = None,
    geometry: Callable[[nn.Module | None, nn.Module], Callable] | None = None,
) -> AttentionSite:
    """A site reading the map at the output of the module's ``child`` (timm: ``attn_drop``),
    with its fused attention switched off for the call where it has a ``fused_attn`` flag.

    Args:
        kind: what the map is (a key of `vizkit.hooks.taps.PATTERN_KINDS`).
        position: computes the relative position bias the module adds (``hook_pos_bias``),
            where ``has_position(module, context)`` says it has one.
        beside: module -> a function attaching hooks that compute the map beside the fused
            kernel (`ExplicitPathReader.beside`), or None where the module's forward is not
            known op for op.
        geometry: (block, module) -> the function giving the window partition (`Tap.geometry`).
    """

    def site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
        if not hasattr(attn, child):
            return []
        taps = [
            Tap(
                f"{path}.{leaf}", f"{path}.{child}", unfused_child(attn, beside),
                shape=MAP_SHAPES[kind].format(n=context.tokens),
                prefix_tokens=context.prefix_tokens, grid=context.grid, kind=kind,
                geometry=None if geometry is None else geometry(context.block, attn),
                **(windows_to_batch if kind == "window" else {}),
            )
        ]  # fmt: skip
        if position is not None and has_position(attn, context):
            taps.append(
                Tap(f"{path}.hook_pos_bias", path, ComputedReader(position), kind="position",
                    shape="H Nq Nk" if kind == "self" else "H w² w²")
            )  # fmt: skip
        return taps

    return site


def recomputed(
    kind: str | Callable[[nn.Module], str],
    compute: Compute,
    *,
    shape: str | None = None,
    position: Compute | None = None,
) -> AttentionSite:
    """A site for a module that never hands its map to a child: the map is computed from the
    module's input and weights as its forward computes it (read-only).

    Args:
        kind: what the map is, or a function of the module giving it.
        compute: ``(module, args, kwargs, output) -> map``.
        shape: the map's shape letters (default from the kind and the block's tokens).
        position: computes the position bias the module adds (``hook_pos_bias``, (H, Nq, Nk)).
    """

    def site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
        what = kind(attn) if callable(kind) else kind
        tokens = context.tokens
        letters = shape or {"self": f"B H {tokens} {tokens}", "pooled": "B H Nq Nk"}[what]
        taps = [Tap(f"{path}.hook_pattern", path, ComputedReader(compute), kind=what,
                    shape=letters, prefix_tokens=context.prefix_tokens,
                    grid=context.grid)]  # fmt: skip
        if position is not None:
            taps.append(Tap(f"{path}.hook_pos_bias", path, ComputedReader(position),
                            kind="position", shape="H Nq Nk"))  # fmt: skip
        return taps

    return site


def unfused_child(
    attn: nn.Module, beside: Callable[[nn.Module], Callable | None] | None = None
) -> Reader:
    """How a map at the output of a child of ``attn`` is read: with ``attn``'s fused attention
    switched off for the call where it has a ``fused_attn`` flag (``beside``: as `captured`)."""
    if not hasattr(attn, "fused_attn"):
        return OutputReader()
    return ExplicitPathReader(
        lambda: unfused_attention([attn]), beside=None if beside is None else beside(attn)
    )
