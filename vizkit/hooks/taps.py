"""Tap: where in a model a canonical activation name is read from, and how to reshape it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor, nn

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

Compute = Callable[[nn.Module, tuple, dict, Any], Tensor]  # (module, args, kwargs, output)
GridFn = Callable[[tuple[int, int]], tuple[int, int]]  # image (H, W) -> token grid (gh, gw)


def _identity(t: Tensor) -> Tensor:
    return t


def _identity_back(new: Tensor, raw: Tensor) -> Tensor:
    return new


@dataclass(frozen=True)
class Tap:
    """One canonical activation and the module site it comes from.

    Attributes:
        name: canonical name, e.g. ``blocks.3.attn.hook_pattern``.
        module: ``named_modules()`` path of the module whose forward is hooked.
        site: ``"output"`` (forward hook) or ``"input"`` (forward-pre hook, positional ``arg``).
        arg: which positional input, for ``site="input"``.
        item: for a module that returns a tuple (MViTv2's blocks return (x, grid)), which item
            of its output is the activation.
        call: for a module that runs several times per forward of ``call_scope`` (CaiT reuses one
            ``drop_path`` for both branches), the 0-based call this tap reads; None: every call.
        call_scope: module whose forward starts a new count of ``call``.
        unfuse: path of a module whose ``fused_attn`` must be False for this site to run.
        shape: the canonical shape in axis letters (B, H, N, Np, C, gh, gw).
        prefix_tokens: prefix tokens on the token axis, when it differs from the model's
            ``num_prefix_tokens`` (CaiT's self-attention stage has none).
        to_canonical: raw module tensor -> canonical layout (a view; also applied to gradients).
        from_canonical: (replacement in canonical layout, raw tensor) -> raw layout.
        kind: for attention maps, what the rows and columns are (a key of `PATTERN_KINDS`).
        grid: image size (H, W) -> the token grid (gh, gw) of this activation, where it differs
            from the patch embedding's (stages of hierarchical models).
        compute: a value derived when ``module`` runs, ``compute(module, args, kwargs, output)``,
            instead of a tensor the forward passes on (a position bias, a map recomputed from the
            module's input); read-only: a hook may not replace it.
        beside: for an attention map a read-only run may compute beside the module's fused
            kernel instead of switching it to the explicit path: ``beside(on_map)`` attaches
            hooks that call ``on_map(map)`` and returns their handles (`vizkit.hooks.beside`).
        geometry: for a window map, a function returning its block's window partition
            (`vizkit.hooks.windows.WindowGeometry`), read when called.
        read_only: a hook may read the value (and take its gradient) but not replace it: the
            module hands it on beside an output it has already computed from it.
        explicit: a function returning the context under which the module materialises the
            value (its family's switch to an explicit attention path), entered for the call.
    """

    name: str
    module: str
    site: Literal["output", "input"] = "output"
    arg: int = 0
    item: int | None = None
    call: int | None = None
    call_scope: str | None = None
    unfuse: str | None = None
    shape: str = ""
    prefix_tokens: int | None = None
    to_canonical: Callable[[Tensor], Tensor] = _identity
    from_canonical: Callable[[Tensor, Tensor], Tensor] = _identity_back
    kind: str = ""
    grid: GridFn | None = None
    compute: Compute | None = None
    beside: Callable[[Callable[[Tensor], None]], list] | None = None
    geometry: Callable[[], Any] | None = None
    read_only: bool = False
    explicit: Callable[[], AbstractContextManager] | None = None


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
