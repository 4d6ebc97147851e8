"""Tap: where in a model a canonical activation name is read from, and how to reshape it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .readers import OutputReader, Reader

__all__ = [
    "PATTERN_KINDS",
    "Tap",
    "heads_last_to_first",
    "nhwc_to_nchw",
    "nhwc_to_nlc",
    "windows_to_batch",
]

# what an attention map's rows and columns are (``Tap.kind``)
PATTERN_KINDS = {
    "self": "softmax over every token, (B, H, N, N)",
    "window": "softmax inside local windows, (B·nW, H, w², w²) in the block's window order",
    "temporal": "divided attention's temporal step: each patch over itself in every frame, "
    "(B·gh·gw, H, T, T)",
    "spatial": "divided attention's spatial step: each frame's [class, patches] over "
    "themselves, (B·T, H, 1 + gh·gw, 1 + gh·gw)",
    "pooled": "softmax over pooled or sub-sampled keys, (B, H, N, Nk) with Nk < N",
    "class": "class attention: the class token's row over [class, patches], (B, H, 1, N)",
    "pool": "an attention-pooling head's latent queries over the tokens, (B, H, Lq, N)",
    "cross": "one branch's class token over the other branch's tokens, (B, H, 1, N')",
    "channel": "cross-covariance attention over channels (XCiT), (B, H, C/H, C/H)",
    "unplaced": "a map of a family vizkit has no adapter for, as captured (layout unknown)",
    "unrolled": "Hiera's mask-unit or global attention over its unrolled (not raster) tokens",
    "content": "the content term of a gated map, softmax(q k^T / sqrt(d)) (ConViT's GPSA)",
    "position": "a relative position bias added to the logits, (H, Nq, Nk), or a positional map",
    "gate": "per-head weight of the positional term (ConViT's GPSA), (H,)",
}

GridFn = Callable[[tuple[int, int]], tuple[int, int]]  # image (H, W) -> token grid (gh, gw)


def _identity(t: Tensor) -> Tensor:
    return t


def _identity_back(new: Tensor, raw: Tensor) -> Tensor:
    return new


@dataclass(frozen=True)
class Tap:
    """One canonical activation: the module it is read at, how (`vizkit.hooks.readers`), and
    its canonical layout.

    Attributes:
        name: canonical name, e.g. ``blocks.3.attn.hook_pattern``.
        module: ``named_modules()`` path of the module whose forward is hooked.
        read: how the value is read there (default: the module's output).
        shape: the canonical shape in axis letters (B, H, N, Np, C, gh, gw).
        prefix_tokens: prefix tokens on the token axis, when it differs from the model's
            ``num_prefix_tokens`` (CaiT's self-attention stage has none).
        to_canonical: raw module tensor -> canonical layout (a view; also applied to gradients).
        from_canonical: (replacement in canonical layout, raw tensor) -> raw layout.
        kind: for attention maps, what the rows and columns are (a key of `PATTERN_KINDS`).
        grid: image size (H, W) -> the token grid (gh, gw) of this activation, where it differs
            from the patch embedding's (stages of hierarchical models).
        geometry: for a window map, a function returning its block's window partition
            (`vizkit.hooks.windows.WindowGeometry`), read when called.
    """

    name: str
    module: str
    read: Reader = OutputReader()
    shape: str = ""
    prefix_tokens: int | None = None
    to_canonical: Callable[[Tensor], Tensor] = _identity
    from_canonical: Callable[[Tensor, Tensor], Tensor] = _identity_back
    kind: str = ""
    grid: GridFn | None = None
    geometry: Callable[[], Any] | None = None


def _heads_last_to_first(t: Tensor) -> Tensor:
    return t.permute(0, 3, 1, 2)  # (B, N, N, H) -> (B, H, N, N)


def _heads_first_to_last(new: Tensor, raw: Tensor) -> Tensor:
    return new.permute(0, 2, 3, 1)  # (B, H, N, N) -> (B, N, N, H)


def _nhwc_to_nlc(t: Tensor) -> Tensor:
    return t.flatten(1, 2) if t.ndim == 4 else t  # (B, gh, gw, C) -> (B, Np, C)


def _nlc_to_nhwc(new: Tensor, raw: Tensor) -> Tensor:
    return new.reshape(raw.shape) if raw.ndim == 4 else new


def _nhwc_to_nchw(t: Tensor) -> Tensor:
    return t.permute(0, 3, 1, 2)  # (B, h, w, C) -> (B, C, h, w)


def _nchw_to_nhwc(new: Tensor, raw: Tensor) -> Tensor:
    return new.permute(0, 2, 3, 1)


def _nchw_to_nlc(t: Tensor) -> Tensor:
    return t.flatten(2).transpose(1, 2) if t.ndim == 4 else t  # (B, C, h, w) -> (B, Np, C)


def _nlc_to_nchw(new: Tensor, raw: Tensor) -> Tensor:
    return new.transpose(1, 2).reshape(raw.shape) if raw.ndim == 4 else new


def _windows_to_batch(t: Tensor) -> Tensor:
    return t.flatten(0, 1) if t.ndim == 5 else t  # (B, nW, H, w², w²) -> (B·nW, H, w², w²)


def _batch_to_windows(new: Tensor, raw: Tensor) -> Tensor:
    return new.reshape(raw.shape)


heads_last_to_first = {"to_canonical": _heads_last_to_first, "from_canonical": _heads_first_to_last}
nhwc_to_nlc = {"to_canonical": _nhwc_to_nlc, "from_canonical": _nlc_to_nhwc}
windows_to_batch = {"to_canonical": _windows_to_batch, "from_canonical": _batch_to_windows}
nchw_to_nlc = {"to_canonical": _nchw_to_nlc, "from_canonical": _nlc_to_nchw}
nhwc_to_nchw = {"to_canonical": _nhwc_to_nchw, "from_canonical": _nchw_to_nhwc}
