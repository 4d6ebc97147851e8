"""Hiera (Ryali et al. 2023, "Hiera: A Hierarchical Vision Transformer without the
Bells-and-Whistles"): tokens are held unrolled (mask units first, Sec. 3) until the strides are
consumed; the streams of unrolled blocks refuse a grid, only raster blocks' streams get one.

Attention in image space: where each unrolled token sits on the raster grid is read from the
model's own ``reroll`` (token indices passed through it as a feature map), for each block's input
(keys) and output (queries). Mask-unit attention (B, H, nW, Nq, Nk) becomes window maps
(B·nW, H, w², w²) in raster windows of raster tokens, as Swin's (`vizkit.hooks.windows`), so the
analyses put it on the grid with zeros outside each query's mask unit; global attention becomes
(B, H, Np, Np) in raster order; a block that pools its queries gives (B, H, Nq, Nk) over its
output grid x its input grid, zero outside each query's mask unit (kind "pooled"). The maps are
recomputed from the attention's input (Sec. 3; queries max-pooled where the block pools)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from timm.models import hiera
from torch import Tensor, nn

from ...hooks.family import AttentionContext, BlockSite, Family, FamilyLayout, register_family
from ...hooks.readers import ComputedReader, Reader
from ...hooks.sites import MAP_SHAPES
from ...hooks.taps import GridFn, Tap
from ...hooks.windows import WindowGeometry, window_token_index
from .common import PRE_NORM

__all__ = [
    "RasterOrder",
    "hiera_pattern",
    "layout",
    "raster_order",
    "unrolled_grid",
    "unrolled_map",
]

Reroll = Callable[[Tensor, int], Tensor]  # (B, N, C) unrolled, step -> (B, gh, gw, C) raster


@dataclass(frozen=True)
class RasterOrder:
    """Where one attention's unrolled tokens sit on the raster grid.

    Attributes:
        keys: (Nk,) raster position on ``key_grid`` of each input token, in the model's order.
        queries: (Nq,) the same for each output token, on ``query_grid``.
    """

    keys: Tensor
    queries: Tensor
    key_grid: tuple[int, int]
    query_grid: tuple[int, int]


def raster_order(reroll: Reroll, sizes: dict, keys_at: int, queries_at: int) -> RasterOrder:
    """The `RasterOrder` of an attention whose input is unrolled as at step ``keys_at`` of the
    model's ``reroll`` and whose output as at ``queries_at`` (``sizes``: step -> its grid)."""
    keys, key_grid = _positions(reroll, keys_at, math.prod(sizes[keys_at]))
    queries, query_grid = _positions(reroll, queries_at, math.prod(sizes[queries_at]))
    return RasterOrder(keys, queries, key_grid, query_grid)


def _positions(reroll: Reroll, step: int, tokens: int) -> tuple[Tensor, tuple[int, int]]:
    """(N,) raster position of each unrolled token, and the grid: token indices rerolled."""
    rolled = reroll(torch.arange(tokens).view(1, tokens, 1), step)  # (1, gh, gw, 1)
    where = torch.empty(tokens, dtype=torch.long)
    where[rolled.flatten()] = torch.arange(tokens)
    return where, (int(rolled.shape[1]), int(rolled.shape[2]))


def unrolled_map(name: str, module: str, order: RasterOrder, windows: int, read: Reader) -> Tap:
    """The tap ``name`` of an attention map (B, H, nW, Nq/nW, Nk/nW) over unrolled tokens
    (global attention: nW = 1, or (B, H, Nq, Nk)), read at ``module`` as ``read`` says, in image
    space: window maps where the mask units tile the grid as rectangles and queries are not
    pooled, else a dense (B, H, Nq, Nk) map ("pooled" where Nq < Nk)."""
    # slot s of mask unit w is token s·nW + w (the unit index varies fastest)
    keys, queries = order.keys.view(-1, windows).T, order.queries.view(-1, windows).T
    pooled = order.query_grid != order.key_grid
    same = not pooled and torch.equal(order.keys, order.queries)
    units = _raster_units(keys, order.key_grid) if same and windows > 1 else None
    common = {"read": read, "prefix_tokens": 0, "grid": lambda image_size: order.query_grid}
    if units is not None:
        geometry, unit, slot = units
        return Tap(name, module, kind="window", shape=MAP_SHAPES["window"],
                   geometry=lambda: geometry, **_window_form(unit, slot, windows),
                   **common)  # fmt: skip
    kind, shape = ("pooled", "B H Nq Nk") if pooled else ("self", "B H Np Np")
    return Tap(name, module, kind=kind, shape=shape,
               **_dense_form(queries, keys, order, windows), **common)  # fmt: skip


def _raster_units(keys: Tensor, grid: tuple[int, int]):
    """(geometry, (nW,) mask unit of each raster window, (nW, w²) slot of each of its raster
    tokens) where the units ``keys`` (nW, w²) are wh x ww rectangles tiling ``grid``; else
    None."""
    windows, area = keys.shape
    rows = keys[0] // grid[1]
    wh = int(rows.max() - rows.min()) + 1
    ww = area // wh
    if wh * ww != area or grid[0] % wh or grid[1] % ww:
        return None
    if (grid[0] // wh) * (grid[1] // ww) != windows:
        return None
    geometry = WindowGeometry((wh, ww))
    index = window_token_index(grid, geometry)  # (nW, w²) raster windows of raster tokens
    flat = keys.flatten()  # unit-major: entry w·w² + s is slot s of unit w
    unit, slot = torch.empty_like(flat), torch.empty_like(flat)
    unit[flat] = torch.arange(windows).repeat_interleave(area)
    slot[flat] = torch.arange(area).repeat(windows)
    unit, slot = unit[index], slot[index]  # of each raster window's raster tokens
    if not (unit == unit[:, :1]).all():
        return None
    return geometry, unit[:, 0], slot


def _as_units(raw: Tensor, windows: int, tokens: int) -> Tensor:
    """(B, H, nW, Nq/nW, Nk/nW): a global map (B, H, Nq, Nk) as one unit; checks the count."""
    units = raw if raw.ndim == 5 else raw.unsqueeze(2)
    if units.shape[2] != windows or units.shape[2] * units.shape[-1] != tokens:
        raise ValueError(
            f"A map of shape {tuple(raw.shape)} does not hold the {tokens} tokens in {windows} "
            "mask units the model was built for: Hiera's unrolling is fixed by its image size "
            "(img_size / config.image_size), and a masked run drops mask units; run it at that "
            "size with every mask unit kept."
        )
    return units


def _window_form(unit: Tensor, slot: Tensor, windows: int) -> dict:
    """to/from (B·nW, H, w², w²), raster windows of raster tokens."""
    tokens = slot.numel()

    def pick(t: Tensor):
        u, s = unit.to(t.device), slot.to(t.device)
        return u[:, None, None], s[:, :, None], s[:, None, :]

    def to_windows(raw: Tensor) -> Tensor:
        units = _as_units(raw, windows, tokens)
        picked = units[(slice(None), slice(None), *pick(raw))]  # (B, H, nW, w², w²)
        return picked.transpose(1, 2).flatten(0, 1)

    def from_windows(new: Tensor, raw: Tensor) -> Tensor:
        units = torch.empty_like(_as_units(raw, windows, tokens))
        units[(slice(None), slice(None), *pick(raw))] = new.unflatten(0, (-1, windows)).transpose(
            1, 2
        )
        return units.reshape(raw.shape)

    return {"to_canonical": to_windows, "from_canonical": from_windows}


def _dense_form(queries: Tensor, keys: Tensor, order: RasterOrder, windows: int) -> dict:
    """to/from (B, H, Nq, Nk) on the query and key grids, zero outside each query's unit."""
    nq, nk = len(order.queries), len(order.keys)

    def pick(t: Tensor):
        return queries.to(t.device)[:, :, None], keys.to(t.device)[:, None, :]

    def to_dense(raw: Tensor) -> Tensor:
        units = _as_units(raw, windows, nk)
        dense = units.new_zeros(*units.shape[:2], nq, nk)
        dense[(slice(None), slice(None), *pick(raw))] = units
        return dense

    def from_dense(new: Tensor, raw: Tensor) -> Tensor:
        return new[(slice(None), slice(None), *pick(raw))].reshape(raw.shape)

    return {"to_canonical": to_dense, "from_canonical": from_dense}


def unrolled_grid(schedule) -> GridFn:
    """The stream grid of a block whose tokens are unrolled as ``schedule`` (strides still
    unrolled, grid) says: its grid where none are, else a refusal."""
    steps, size = schedule

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        if steps:
            raise ValueError(
                "Hiera holds these tokens in its unrolled order (mask units first), not on a "
                "raster grid, so they cannot be drawn as a map; only its last stage is raster. "
                "Use the last block (blocks.-1) or Hiera's own reroll for the stream; the "
                "attention maps (<block>.attn.hook_pattern) are in raster order."
            )
        return tuple(size)

    return grid


def layout(model: hiera.Hiera) -> FamilyLayout:
    schedule = model.reroll.schedule  # block -> (strides still unrolled, grid) of its output
    blocks = [
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0, grid=unrolled_grid(schedule[i]),
                  input_grid=unrolled_grid(schedule[max(i - 1, 0)]))
        for i in range(len(model.blocks))
    ]  # fmt: skip
    return FamilyLayout("hiera", blocks, [])


def hiera_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, nW, Nq, Nk) inside each mask unit, or (B, H, Nq, Nk) for global attention, in
    Hiera's unrolled token order (not raster order)."""
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


def _site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` in image space, its raster order read from the model's ``reroll``."""
    model = context.model
    i = next(j for j, block in enumerate(model.blocks) if block is context.block)
    sizes = {step: size for step, (_, size) in model.reroll.schedule.items()}
    order = raster_order(model.reroll, sizes, max(i - 1, 0), i)
    windows = 1
    if attn.use_mask_unit_attn:
        windows = len(order.keys) // (attn.q_stride * attn.window_size)
    read = ComputedReader(hiera_pattern)
    return [unrolled_map(f"{path}.hook_pattern", path, order, windows, read)]


FAMILY = register_family(
    Family(
        "hiera",
        "timm",
        models={hiera.Hiera: layout},
        blocks={hiera.HieraBlock: PRE_NORM},
        attention={hiera.MaskUnitAttention: _site},
    )
)
