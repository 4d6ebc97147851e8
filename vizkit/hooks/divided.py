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

What each step adds to the stream is written on the clip's tokens too: the temporal step's
addition (``temporal_dense``'s output) is zero on the class token (`temporal_addition`); the
spatial step's per-frame outputs give the class token their mean over the frames
(`spatial_addition`). The mean is no view of the module's output, so its names read it with a
`TokensReader`: the forward goes on with the tokens themselves, and their gradient is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .layout import TokenLayout
from .readers import Emit, Reader

__all__ = [
    "TokensReader",
    "space_major_map",
    "space_major_stream",
    "spatial_addition",
    "spatial_addition_back",
    "spatial_to_tokens",
    "temporal_addition",
    "temporal_addition_back",
    "temporal_to_tokens",
]


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


def temporal_addition(added: Tensor, frames: int) -> Tensor:
    """(B, gh·gw·T, C) what the temporal step adds (``temporal_dense``'s output: the patches
    space-major, no class token) -> (B, 1 + T·gh·gw, C) on the clip's tokens, frame-major, zero
    on the class token (the step leaves it as it is)."""
    patches = space_major_stream(added, frames, prefix=0)
    return torch.cat([patches.new_zeros(len(patches), 1, patches.shape[-1]), patches], 1)


def temporal_addition_back(new: Tensor, raw: Tensor, frames: int) -> Tensor:
    """(B, 1 + T·gh·gw, C) a replacement of `temporal_addition` -> ``temporal_dense``'s
    (B, gh·gw·T, C).

    Raises:
        ValueError: a class-token row that is not zero: the temporal step adds nothing to the
            class token, so there is nowhere to put it.
    """
    if bool((new[:, 0] != 0).any()):
        raise ValueError(
            "The temporal step of divided attention adds nothing to the class token (it takes "
            "no part in that step), so a non-zero class-token row of hook_temporal_out has no "
            "place in the model. Leave that row zero; edit the class token at the block's "
            "hook_spatial_out or hook_resid_pre instead."
        )
    return space_major_stream(new[:, 1:], frames, prefix=0, inverse=True)


def spatial_addition(added: Tensor, frames: int) -> Tensor:
    """(B·T, 1 + gh·gw, C) the spatial step's output per frame (batch index b·T + t: [class,
    frame t's patches]) -> (B, 1 + T·gh·gw, C) what it adds to the clip's tokens, frame-major:
    the class token gets its outputs' mean over the frames, as the block adds it."""
    per_frame = added.unflatten(0, (-1, frames))  # (B, T, 1 + gh·gw, C)
    return torch.cat([per_frame[:, :, :1].mean(1), per_frame[:, :, 1:].flatten(1, 2)], 1)


def spatial_addition_back(new: Tensor, raw: Tensor, frames: int) -> Tensor:
    """(B, 1 + T·gh·gw, C) a replacement of `spatial_addition` -> the per-frame (B·T,
    1 + gh·gw, C) output ``raw`` stands for: each patch back in its frame, and every frame's
    class output moved by the same amount, so that their mean is the new class row (exactly
    ``raw``'s where the row is unchanged)."""
    per_frame = raw.unflatten(0, (-1, frames))  # (B, T, 1 + gh·gw, C)
    own = per_frame[:, :, :1]
    shift = new[:, None, :1] - own.mean(1, keepdim=True)  # (B, 1, 1, C)
    patches = new[:, 1:].unflatten(1, (frames, -1))  # (B, T, gh·gw, C)
    return torch.cat([own + shift, patches], 2).flatten(0, 1)


def _every_call() -> bool:
    return True


@dataclass(frozen=True)
class TokensReader(Reader):
    """A module's tensor output handed on in the clip's token layout: ``to_tokens(raw)``, a
    function of it that is no view (`spatial_addition`'s mean over the frames). The forward
    goes on with ``back(tokens, raw)`` where a hook replaced the tokens or their gradient is
    wanted, so edits and gradients act on the tokens themselves (a `Tap`'s ``to_canonical``
    is applied to gradients too, which is right for a view only). Its `Tap` keeps the
    identity layout."""

    to_tokens: Callable[[Tensor], Tensor]
    back: Callable[[Tensor, Tensor], Tensor]

    def attach(
        self, module: nn.Module, emit: Emit, selected: Callable[[], bool] = _every_call
    ) -> list[RemovableHandle]:
        def forward_hook(mod: nn.Module, args: tuple, output: Any) -> Tensor | None:
            if not selected():
                return None
            tokens = self.to_tokens(output)
            used = emit(tokens)
            return None if used is tokens else self.back(used, output)

        return [module.register_forward_hook(forward_hook)]
