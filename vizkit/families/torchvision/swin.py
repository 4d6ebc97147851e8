"""torchvision's Swin Transformer and Swin V2 (``swin_t`` ... ``swin_v2_b``; Liu et al. 2021,
2022): ``features.0`` embeds 4 x 4 patches into a channels-last (B, gh, gw, C) map, then stages
``features.{1, 3, 5, ...}`` of blocks alternate with 2 x 2 patch merging ``features.{2, 4, ...}``
(the stage grid is the previous one halved, rounded up: the merging pads odd sides).

The blocks are ``x + stochastic_depth(attn(norm1(x)))``, ``x + stochastic_depth(mlp(norm2(x)))``
(V2, post-norm: ``x + stochastic_depth(norm1(attn(x)))``, ``x + stochastic_depth(norm2(mlp(x)))``),
one ``stochastic_depth`` module closing both branches (its first and second call).

The attention map is computed inside the functional ``shifted_window_attention`` and handed to no
module, so it is recomputed from the attention module's input as that function computes it: the
map is padded to window multiples, cyclically shifted, cut into windows (B·nW, H, w², w²) in
torchvision's window order. torchvision keeps the window size on small grids and pads the map
instead, and drops the shift along a side whose padded length is at most one window; the
geometry of a block is therefore the one of the last forward its map was computed in (before any,
the block's declared window and shift)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...hooks.family import (
    AttentionContext,
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    register_family,
)
from ...hooks.layout import TokenLayout
from ...hooks.readers import ComputedReader
from ...hooks.taps import GridFn, Tap, nhwc_to_nchw, nhwc_to_nlc
from ...hooks.windows import WindowGeometry
from ..grids import conv_grid

__all__ = ["effective_shift", "layout", "swin_position_bias"]

_SWIN = "torchvision.models.swin_transformer"


def layout(model: nn.Module) -> FamilyLayout:
    """``SwinTransformer`` (V1 and V2: the same model class, other blocks and merging)."""
    features = model.features
    patch = conv_grid(features[0][0])  # the patch embedding's convolution
    blocks: list[BlockSite] = []
    extra = [Tap("hook_embed", "features.0", shape="B Np C", prefix_tokens=0, grid=patch,
                  **nhwc_to_nlc)]  # fmt: skip
    scale, grid = 1, patch
    for k, stage in enumerate(features):
        if k == 0:
            continue
        if not isinstance(stage, nn.Sequential):  # patch merging: the grid halves
            scale *= 2
            continue
        grid = conv_grid(features[0][0], scale)
        blocks += [
            BlockSite(f"features.{k}.{i}", tokens="Np", prefix_tokens=0, grid=grid,
                      channels_last=True)
            for i in range(len(stage))
        ]  # fmt: skip
        extra.append(Tap(f"features.{k}.hook_out", f"features.{k}", shape="B C gh gw",
                         **nhwc_to_nchw))  # fmt: skip
    if getattr(model, "norm", None) is not None:
        extra.append(Tap("hook_final_norm", "norm", shape="B Np C", prefix_tokens=0, grid=grid,
                         **nhwc_to_nlc))  # fmt: skip
    if getattr(model, "permute", None) is not None:  # (B, C, gh, gw) for the pooling
        extra.append(Tap("permute.hook_out", "permute", shape="B C gh gw"))
    return FamilyLayout(
        "swin", blocks, extra, merges_patches=True, tokens=_patch_tokens(patch),
        reads_class_token=False,
    )  # fmt: skip


def _patch_tokens(patch: GridFn) -> Callable[[tuple[int, int]], TokenLayout]:
    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, tuple(patch(image_size)), False)

    return tokens


def effective_shift(attn: nn.Module, grid: tuple[int, int]) -> tuple[int, int]:
    """The shift ``shifted_window_attention`` applies on a (gh, gw) map: the declared one,
    dropped along a side whose padded length is at most one window."""
    shift = []
    for size, window, s in zip(grid, attn.window_size, attn.shift_size, strict=True):
        padded = -(-size // window) * window
        shift.append(0 if window >= padded else int(s))
    return tuple(shift)


def _windows(attn: nn.Module, x: Tensor) -> tuple[Tensor, WindowGeometry]:
    """(B·nW, H, w², w²) softmax map of ``attn`` on its input ``x`` (B, gh, gw, C), computed as
    ``shifted_window_attention`` computes it, and the window geometry it used."""
    batch, height, width, channels = x.shape
    (wh, ww), heads = attn.window_size, attn.num_heads
    x = F.pad(x, (0, 0, 0, (ww - width % ww) % ww, 0, (wh - height % wh) % wh))
    _, pad_h, pad_w, _ = x.shape
    sh, sw = effective_shift(attn, (height, width))
    if sh + sw > 0:
        x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
    windows = (pad_h // wh) * (pad_w // ww)
    x = x.view(batch, pad_h // wh, wh, pad_w // ww, ww, channels)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(batch * windows, wh * ww, channels)
    logit_scale = getattr(attn, "logit_scale", None)
    bias = attn.qkv.bias
    if logit_scale is not None and bias is not None:  # V2: no key bias
        bias = bias.clone()
        third = bias.numel() // 3
        bias[third : 2 * third].zero_()
    qkv = F.linear(x, attn.qkv.weight, bias)
    qkv = qkv.reshape(x.size(0), x.size(1), 3, heads, channels // heads).permute(2, 0, 3, 1, 4)
    q, k = qkv[0], qkv[1]
    if logit_scale is not None:  # V2: scaled cosine attention
        logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        logits = logits * torch.clamp(logit_scale, max=math.log(100.0)).exp()
    else:
        logits = (q * (channels // heads) ** -0.5) @ k.transpose(-2, -1)
    logits = logits + attn.get_relative_position_bias()
    if sh + sw > 0:
        logits = logits.view(batch, windows, heads, wh * ww, wh * ww)
        logits = logits + _shift_mask(x, (pad_h, pad_w), (wh, ww), (sh, sw))[None, :, None]
        logits = logits.view(-1, heads, wh * ww, wh * ww)
    return logits.softmax(-1), WindowGeometry((wh, ww), (sh, sw))


def _shift_mask(x: Tensor, padded: tuple[int, int], window: tuple[int, int],
                shift: tuple[int, int]) -> Tensor:  # fmt: skip
    """(nW, w², w²): -100 between tokens from different regions of the shifted map, else 0."""
    (pad_h, pad_w), (wh, ww), (sh, sw) = padded, window, shift
    mask = x.new_zeros((pad_h, pad_w))
    count = 0
    for h in ((0, -wh), (-wh, -sh), (-sh, None)):
        for w in ((0, -ww), (-ww, -sw), (-sw, None)):
            mask[h[0] : h[1], w[0] : w[1]] = count
            count += 1
    mask = mask.view(pad_h // wh, wh, pad_w // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


def swin_position_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, w², w²): the relative position bias the module adds to every window's logits (V2:
    16 sigmoid of the continuous position bias MLP)."""
    return attn.get_relative_position_bias()[0]


def _window_site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` (recomputed, read-only) and ``hook_pos_bias``; the geometry is the one
    of the last forward the map was computed in."""
    seen: dict[str, WindowGeometry] = {}

    def pattern(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
        windows, seen["geometry"] = _windows(module, args[0] if args else kwargs["x"])
        return windows

    def geometry() -> WindowGeometry:
        declared = WindowGeometry(tuple(attn.window_size), tuple(attn.shift_size))
        return seen.get("geometry", declared)

    return [
        Tap(f"{path}.hook_pattern", path, ComputedReader(pattern), kind="window",
            shape="B·nW H w² w²", prefix_tokens=context.prefix_tokens, grid=context.grid,
            geometry=geometry),
        Tap(f"{path}.hook_pos_bias", path, ComputedReader(swin_position_bias), kind="position",
            shape="H w² w²"),
    ]  # fmt: skip


FAMILY = register_family(
    Family(
        "swin",
        "torchvision",
        models={f"{_SWIN}:SwinTransformer": layout},
        blocks={
            f"{_SWIN}:SwinTransformerBlock": ResidualSpec(
                "stochastic_depth", "stochastic_depth", "norm2"
            ),
            f"{_SWIN}:SwinTransformerBlockV2": ResidualSpec(
                "stochastic_depth", "stochastic_depth", "mlp"
            ),
        },
        attention={
            f"{_SWIN}:ShiftedWindowAttention": _window_site,
            f"{_SWIN}:ShiftedWindowAttentionV2": _window_site,
        },
    )
)
