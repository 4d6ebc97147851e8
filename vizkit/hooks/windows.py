"""Window attention in image space: put the windows of a (shifted) window partition back on the
stage's patch grid.

Swin (Liu et al. 2021, Sec. 3.2) attends inside w x w windows of a map cyclically shifted by s;
Twins' locally-grouped attention and MaxViT's block attention use unshifted windows, MaxViT's grid
attention a dilated grid. A window map is (B·nW, H, w², w²) in the model's window order; its
image-space view is the block-sparse (B, H, Np, Np) map over the stage grid in raster order, each
query's row non-zero only inside its window. Each family says how its blocks partition
(`Tap.geometry`, a function returning a `WindowGeometry`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "WindowGeometry",
    "patch_merge_matrix",
    "window_token_index",
    "windows_to_grid",
]


@dataclass(frozen=True)
class WindowGeometry:
    """How a block partitions its stage grid.

    Attributes:
        window: (wh, ww), tokens per window side (MaxViT grid attention: the grid size).
        shift: (sh, sw) cyclic shift applied before partitioning (Swin's shifted blocks).
        dilated: MaxViT's grid attention: window (a, b) holds the tokens (i H/g + a, j W/g + b).
    """

    window: tuple[int, int]
    shift: tuple[int, int] = (0, 0)
    dilated: bool = False


def window_token_index(grid: tuple[int, int], geometry: WindowGeometry) -> Tensor:
    """(nW, w²) raster index on the ``grid`` of each window's tokens, in the model's order.

    Raises:
        ValueError: the grid is not a multiple of the window (the model pads it, and the padded
            keys' share of each row has no place on the grid).
    """
    (gh, gw), (wh, ww), (sh, sw) = grid, geometry.window, geometry.shift
    if gh % wh or gw % ww:
        raise ValueError(
            f"The {gh}x{gw} grid is not a multiple of the {wh}x{ww} windows: the model pads it, "
            "and attention to padded tokens has no place on the image. Use an input size whose "
            "stage grids are multiples of the window (e.g. 224 for window 7), or read the window "
            "maps as captured (hook_pattern, (B·nW, H, w², w²))."
        )
    rows, cols = torch.arange(gh), torch.arange(gw)
    if geometry.dilated:  # window (a, b), token (i, j) -> (i gh/wh + a, j gw/ww + b)
        y = rows.view(wh, gh // wh).T  # (gh/wh windows, wh tokens)
        x = cols.view(ww, gw // ww).T
    else:  # shifted map position p holds grid position (p + s) mod g
        y = ((rows + sh) % gh).view(gh // wh, wh)
        x = ((cols + sw) % gw).view(gw // ww, ww)
    index = y[:, None, :, None] * gw + x[None, :, None, :]  # (nWh, nWw, wh, ww)
    return index.reshape(-1, wh * ww)


def windows_to_grid(pattern: Tensor, grid: tuple[int, int], geometry: WindowGeometry) -> Tensor:
    """(B·nW, H, w², w²) window maps -> (B, H, Np, Np) on the raster grid, zero across windows.

    Entries the model masked across a shift boundary (Swin's -100 logits) stay where they are,
    ~0, so rows keep their sums.
    """
    index = window_token_index(grid, geometry).to(pattern.device)
    windows, area = index.shape
    if pattern.shape[0] % windows or pattern.shape[-1] != area:
        raise ValueError(
            f"A {grid[0]}x{grid[1]} grid in {geometry.window} windows has {windows} windows of "
            f"{area} tokens; the map is {tuple(pattern.shape)}."
        )
    batch, heads, patches = pattern.shape[0] // windows, pattern.shape[1], grid[0] * grid[1]
    values = pattern.reshape(batch, windows, heads, area, area).transpose(1, 2)
    pairs = (index[:, :, None] * patches + index[:, None, :]).flatten()  # (nW·w²·w²,)
    dense = pattern.new_zeros(batch, heads, patches * patches)
    dense[..., pairs] = values.reshape(batch, heads, -1)
    return dense.view(batch, heads, patches, patches)


def patch_merge_matrix(grid: tuple[int, int], dtype=torch.float64) -> Tensor:
    """(Nm, Np): Swin's 2 x 2 patch merging as token relevance flow, each merged token the mean
    of the (up to four; fewer at an odd edge, which the model pads with zeros) raster tokens it
    is built from. The merged grid is ceil(gh / 2) x ceil(gw / 2)."""
    gh, gw = grid
    mw = -(-gw // 2)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    merged = ((rows // 2) * mw + cols // 2).flatten()
    matrix = torch.zeros(-(-gh // 2) * mw, gh * gw, dtype=dtype)
    matrix[merged, torch.arange(gh * gw)] = 1.0
    return matrix / matrix.sum(1, keepdim=True)
