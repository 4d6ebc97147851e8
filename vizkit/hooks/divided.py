"""Divided space-time attention in token space: TimeSformer's (Bertasius, Wang and Torresani,
ICML 2021, "Is Space-Time Attention All You Need for Video Understanding?", Sec. 3, "divided
space-time attention") temporal and spatial maps put on the clip's tokens.

A divided block attends in two steps. The temporal step lets each patch attend over the same
patch in every frame, (B·gh·gw, H, T, T); the class token takes no part. The spatial step lets
each frame's [class, patches] attend over themselves, (B·T, H, 1 + Np', 1 + Np') (Np' = gh·gw),
the class token copied into every frame and its outputs averaged over the frames. Each step is a
linear mix of its value vectors, so each is written exactly as one (B, H, N, N) map over the
clip's tokens [class, T x gh x gw patches] (frame-major, as `TokenLayout` lays them out):

- temporal: patch (t, p)'s row holds A_p[t, t'] at (t', p), zero elsewhere; the class token's
  row holds it on itself (weight 1), as the step leaves it unchanged, so the map stays
  row-stochastic and rollout carries the class token through.
- spatial: patch (t, p)'s row holds frame t's row, A_t[p, :] over [class, frame t's patches];
  the class token's row is the frames' mean, mean_t A_t[class, class] on itself and
  A_t[class, p'] / T at (t, p').

TimeSformer keeps its stream space-major (patch p's T frames side by side, token 1 + p·T + t);
`space_major_stream` and `space_major_map` convert it to and from the frame-major order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layout import TokenLayout

__all__ = ["space_major_map", "space_major_stream", "spatial_to_tokens", "temporal_to_tokens"]


def _check(layout: TokenLayout, what: str) -> tuple[int, int]:
    if layout.frames is None or layout.num_prefix_tokens not in (0, 1):
        raise ValueError(
            f"{what} maps need a video layout with at most a class token; got {layout}."
        )
    return layout.frames, layout.grid[0] * layout.grid[1]


def temporal_to_tokens(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """(B·Np', H, T, T) temporal maps (batch index b·Np' + p) -> (B, H, N, N) over the clip's
    tokens, zero between different patches (the class token on itself)."""
    frames, area = _check(layout, "Temporal")
    heads = pattern.shape[1]
    values = pattern.reshape(-1, area, heads, frames, frames).permute(0, 2, 3, 1, 4)  # b h t p u
    eye = torch.eye(area, dtype=pattern.dtype, device=pattern.device)
    patches = torch.einsum("bhtpu,pq->bhtpuq", values, eye).flatten(4).flatten(2, 3)
    return _with_prefix(patches, layout.num_prefix_tokens, row=None, column=None, own=1.0)


def spatial_to_tokens(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """(B·T, H, P + Np', P + Np') spatial maps (batch index b·T + t; P = 0 or 1 class token)
    -> (B, H, N, N) over the clip's tokens, zero between different frames."""
    frames, area = _check(layout, "Spatial")
    prefix = layout.num_prefix_tokens
    per_frame = pattern.unflatten(0, (-1, frames)).transpose(1, 2)  # (B, H, T, P+Np', P+Np')
    eye = torch.eye(frames, dtype=pattern.dtype, device=pattern.device)
    blocks = per_frame[..., prefix:, prefix:]  # (B, H, T, Np', Np')
    patches = torch.einsum("bhtpq,tu->bhtpuq", blocks, eye).flatten(4).flatten(2, 3)
    if not prefix:
        return patches
    column = per_frame[..., 1:, 0].flatten(2)  # (B, H, T·Np'): patch (t, p) -> class
    row = per_frame[..., 0, 1:].flatten(2) / frames  # class -> patch (t, p), the frames' mean
    return _with_prefix(patches, 1, row, column, own=per_frame[..., 0, 0].mean(-1))


def _with_prefix(
    patches: Tensor, prefix: int, row: Tensor | None, column: Tensor | None, own: Tensor | float
) -> Tensor:
    """(B, H, Np, Np) patch map with a class token's ``row`` (B, H, Np), ``column`` (B, H, Np)
    and weight on itself ``own`` put in front (nothing when ``prefix`` is 0)."""
    if not prefix:
        return patches
    b, h, n, _ = patches.shape
    out = patches.new_zeros(b, h, n + 1, n + 1)
    out[..., 1:, 1:] = patches
    out[..., 0, 0] = own
    if row is not None:
        out[..., 0, 1:] = row
    if column is not None:
        out[..., 1:, 0] = column
    return out


def _patch_order(frames: int, patches: int, device: torch.device) -> Tensor:
    """(Np,) index of each frame-major patch (t, p) in the space-major order (p·T + t)."""
    if patches % frames:
        raise ValueError(f"{patches} patch tokens are not {frames} frames of one grid.")
    t, p = torch.meshgrid(torch.arange(frames), torch.arange(patches // frames), indexing="ij")
    return (p * frames + t).flatten().to(device)


def space_major_stream(tokens: Tensor, frames: int, prefix: int, inverse: bool = False) -> Tensor:
    """(B, P + Np, C) tokens in TimeSformer's space-major order -> frame-major (``inverse``:
    back); ``prefix`` = P."""
    order = _patch_order(frames, tokens.shape[1] - prefix, tokens.device)
    if inverse:
        order = torch.argsort(order)
    return torch.cat([tokens[:, :prefix], tokens[:, prefix:][:, order]], 1)


def space_major_map(pattern: Tensor, frames: int, prefix: int, inverse: bool = False) -> Tensor:
    """(B, H, N, N) a joint space-time map over space-major tokens -> over frame-major tokens
    (``inverse``: back)."""
    order = _patch_order(frames, pattern.shape[-1] - prefix, pattern.device)
    if inverse:
        order = torch.argsort(order)
    full = torch.cat([torch.arange(prefix, device=pattern.device), order + prefix])
    return pattern[..., full, :][..., full]
