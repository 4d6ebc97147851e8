"""SAM2's Hiera (``hieradet_sam2``; Ravi et al. 2024, "SAM 2: Segment Anything in Images and
Videos"): blocks ``blocks.{i}`` on a channels-last (B, h, w, C) map in raster order; the
first block of a pooling stage max-pools its queries and shortcut by ``q_stride`` (rounding
down). Attention inside windows (the map padded to whole windows), or over the whole map in the
global-attention blocks.

Maps in image space, recomputed from the module's input as its forward computes them:

- windows, queries not pooled: (B·nW, H, w², w²) in raster windows of raster tokens (kind
  "window"), put on the grid by the analyses as Swin's (`vizkit.hooks.windows`), which refuse a
  grid that is not a multiple of the window;
- global: (B, H, Np, Np) (kind "self");
- pooled queries: (B, H, Nq, Nk) over the output grid x the input grid (kind "pooled"), zero
  outside each query's window; the windowed ones are recomputed from the block's input (the
  attention sees windows only), and where a window reaches into the model's zero padding the
  padded keys' share has no place on the image: those rows sum to less than 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from timm.models import hieradet_sam2
from torch import Tensor, nn

from ...hooks.family import (
    AttentionContext,
    AttentionSite,
    BlockSite,
    Family,
    FamilyLayout,
    register_family,
)
from ...hooks.layout import TokenLayout
from ...hooks.readers import Compute, ComputedReader
from ...hooks.sites import MAP_SHAPES
from ...hooks.taps import GridFn, Tap
from ...hooks.windows import WindowGeometry, window_token_index
from ..grids import conv_grid
from .common import PRE_NORM, embed_tap

__all__ = ["layout", "pooled_query_pattern", "sam2_layout", "sam2_site"]

Pair = tuple[int, int]


def sam2_layout(
    family: str, base: GridFn, strides: list[Pair | None], extra: list[Tap]
) -> FamilyLayout:
    """The layout of SAM2-style blocks ``blocks.{i}`` (channels-last) from the patch grid
    ``base`` and each block's query stride (None: no pooling)."""
    blocks, grid = [], base
    for i, stride in enumerate(strides):
        before = grid
        grid = grid if stride is None else _floored(grid, stride)
        blocks.append(
            BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid, input_grid=before,
                      channels_last=True)
        )  # fmt: skip

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, base(image_size), False)

    return FamilyLayout(family, blocks, extra, tokens=tokens, reads_class_token=False)


def _floored(base: GridFn, stride: Pair) -> GridFn:
    """``base`` max-pooled by ``stride`` (kernel = stride, no padding: rounding down)."""

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        return tuple(g // s for g, s in zip(base(image_size), stride, strict=True))

    return grid


def sam2_site(
    window: Callable[[nn.Module], Pair | None],
    stride: Callable[[nn.Module], Pair | None],
    pattern: Compute,
    windows: Callable[[nn.Module, Tensor], Tensor],
) -> AttentionSite:
    """The site of a SAM2-style attention in image space.

    Args:
        window: block -> its (wh, ww) windows, or None for global attention.
        stride: block -> its query stride, or None.
        pattern: the map as the attention computes it from its input, (B', H, Nq, Nk).
        windows: (block, its input (B, h, w, C)) -> the attention's input, (B·nW, wh, ww, C).
    """

    def site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
        size, step = window(context.block), stride(context.block)
        common = {"prefix_tokens": 0, "grid": context.grid}
        name = f"{path}.hook_pattern"
        if size is not None and step is None:
            geometry = WindowGeometry(size)
            return [Tap(name, path, ComputedReader(pattern), kind="window",
                        shape=MAP_SHAPES["window"], geometry=lambda: geometry,
                        **common)]  # fmt: skip
        if size is None:
            kind, shape = ("self", "B H Np Np") if step is None else ("pooled", "B H Nq Nk")
            return [Tap(name, path, ComputedReader(pattern), kind=kind, shape=shape, **common)]
        block = path.rsplit(".", 1)[0]  # read at the block: the attention sees windows only
        read = ComputedReader(_pooled_windows(pattern, windows, size, step))
        return [Tap(name, block, read, kind="pooled", shape="B H Nq Nk", **common)]

    return site


def _pooled_windows(pattern: Compute, windows, size: Pair, step: Pair) -> Compute:
    """(block, args, kwargs, output) -> (B, H, Nq, Nk): a windowed attention with pooled queries
    recomputed from the block's input and put on the output x input grid."""

    def compute(block: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
        x = args[0] if args else kwargs["hidden_states"]  # (B, h, w, C)
        maps = pattern(block.attn, (windows(block, x),), {}, None)  # (B·nW, H, aq, ak)
        grids = (tuple(x.shape[1:3]), tuple(output.shape[1:3]))
        return _windows_on_grid(maps, *grids, size, step)

    return compute


def _windows_on_grid(maps: Tensor, grid: Pair, out: Pair, size: Pair, step: Pair) -> Tensor:
    """(B·nW, H, aq, ak) maps of raster windows (queries pooled by ``step``) -> (B, H, Nq, Nk)
    on the ``out`` x ``grid`` raster grids; keys in the padding are left out."""
    (gh, gw), (wh, ww), (qh, qw) = grid, size, (size[0] // step[0], size[1] // step[1])
    rows, cols = -(-gh // wh), -(-gw // ww)  # windows per side, over the padded map
    keys = window_token_index((rows * wh, cols * ww), WindowGeometry(size)).to(maps.device)
    queries = window_token_index((rows * qh, cols * qw), WindowGeometry((qh, qw)))
    queries = queries.to(maps.device)
    batch, heads = maps.shape[0] // (rows * cols), maps.shape[1]
    padded = maps.new_zeros(batch, heads, rows * qh * cols * qw, rows * wh * cols * ww)
    values = maps.unflatten(0, (batch, rows * cols)).transpose(1, 2)  # (B, H, nW, aq, ak)
    padded[:, :, queries[:, :, None], keys[:, None, :]] = values
    padded = padded.view(batch, heads, rows * qh, cols * qw, rows * wh, cols * ww)
    return padded[:, :, : out[0], : out[1], :gh, :gw].reshape(batch, heads, -1, gh * gw)


def pooled_query_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, Nq, N): the attention of a (B, h, w, C) map, queries pooled by ``q_pool``."""
    x = args[0]
    batch, height, width, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(batch, height * width, 3, attn.num_heads, -1).unbind(2)
    if attn.q_pool is not None:
        q = attn.q_pool(q.reshape(batch, height, width, -1).permute(0, 3, 1, 2))
        q = q.permute(0, 2, 3, 1).reshape(batch, -1, attn.num_heads, k.shape[-1])
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    return ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)


def _windows(block: nn.Module, x: Tensor) -> Tensor:
    """The attention's input: ``norm1(x)`` padded to whole windows, partitioned (the norm run by
    its ``forward``, so its own hooks do not fire a second time)."""
    x = block.norm1.forward(x)
    _, _, pad_h, pad_w = hieradet_sam2._calc_pad(*x.shape[1:3], block.window_size)
    return hieradet_sam2.window_partition(F.pad(x, (0, 0, 0, pad_w, 0, pad_h)), block.window_size)


def layout(model: hieradet_sam2.HieraDet) -> FamilyLayout:
    pe = model.patch_embed
    if isinstance(pe, hieradet_sam2.HieraPatchEmbed):
        base = conv_grid(pe.proj)
    else:  # a ViT-style patch embedding, padded to whole patches

        def base(image_size: tuple[int, int]) -> tuple[int, int]:
            return tuple(pe.dynamic_feat_size(tuple(image_size)))

    strides = [block.q_stride for block in model.blocks]
    return sam2_layout("hieradet_sam2", base, strides, [embed_tap(grid=base)])


FAMILY = register_family(
    Family(
        "hieradet_sam2",
        "timm",
        models={hieradet_sam2.HieraDet: layout},
        blocks={hieradet_sam2.MultiScaleBlock: PRE_NORM},
        attention={
            hieradet_sam2.MultiScaleAttention: sam2_site(
                lambda block: block.window_size if block.is_windowed else None,
                lambda block: block.q_stride,
                pooled_query_pattern,
                _windows,
            )
        },
    )
)
