"""Shared plumbing of the analyses: wrap the model, move the batch, find attention layers."""

from __future__ import annotations

import torch
from torch import Tensor

from ..hooks import HookedModel, TokenLayout
from ..hooks.divided import spatial_to_tokens, temporal_to_tokens
from ..hooks.selector import LayerSpec, select_layers
from ..hooks.taps import PATTERN_KINDS
from ..hooks.windows import windows_to_grid

__all__ = [
    "applied_attention_names",
    "attention_names",
    "class_attention_names",
    "float_bytes",
    "grid_map",
    "layer_index",
    "pooling_attention_names",
    "self_attention_names",
    "token_pixels",
    "without_applied_suffix",
    "query_index",
    "reads_class_token",
]

_DIVIDED = {"temporal": temporal_to_tokens, "spatial": spatial_to_tokens}
_SELF_KINDS = ("", "self", "window", "temporal", "spatial")  # "": a vizkit layer's own HookPoint


def reads_class_token(hm: HookedModel) -> bool:
    """Whether the model's head reads the class token alone (its family says, or timm
    ``global_pool="token"``, or a head that says so with ``reads_class_token = True``, as SoT's
    does), rather than pooling every token."""
    if hm.family is not None and hm.family.reads_class_token is not None:
        return hm.family.reads_class_token
    model = hm.model if hm.family is None else hm.model.get_submodule(hm.family.root)
    head_reads = getattr(getattr(model, "head", None), "reads_class_token", False) is True
    return getattr(model, "global_pool", None) == "token" or head_reads


def token_pixels(layout: TokenLayout, image_size: tuple[int, int]) -> tuple[float, float]:
    """(rows, cols) of image pixels per token of ``layout`` for an (H, W) input (the patch size
    for ViTs; the stage's stride for hierarchical models)."""
    return tuple(size / cells for size, cells in zip(image_size, layout.grid, strict=True))


def attention_names(hm: HookedModel, layers: LayerSpec | None = None) -> list[str]:
    """Names of the self-attention maps (``<block>.attn.hook_pattern`` over the block's tokens,
    also window attention) of ``layers`` (None: all; ints count the model's self-attention
    layers in forward order, negative from the end; names as in `vizkit.hooks.select_layers`,
    where a map applied to the values, ``..._mixed`` or ``..._refined``, names its layer)."""
    names = self_attention_names(hm)
    if not names:
        kinds = sorted({hm.tap(n).kind for n in hm.hook_names()} - {""})
        other = (
            f" Its maps are {', '.join(kinds)} ({'; '.join(PATTERN_KINDS[k] for k in kinds)}): "
            "read them as captured with run_with_cache(x, names='*hook_pattern')."
            if kinds
            else " For CNNs use gradcam()."
        )
        raise ValueError(
            f"{type(hm.model).__name__} has no self-attention maps over its tokens "
            "(<block>.attn.hook_pattern on a known token grid); docs/coverage.md lists the "
            "families." + other
        )
    if layers is None:
        return names
    known = set(hm.hook_names())
    applied = [n + s for n in names for s in APPLIED_SUFFIXES if n + s in known]
    chosen = select_layers(layers, names, names + applied, what="self-attention layers")
    return list(dict.fromkeys(without_applied_suffix(name) for name in chosen))


def self_attention_names(hm: HookedModel) -> list[str]:
    """Every self-attention map name of the model, in forward order (possibly none)."""
    return [n for n in hm.hook_names() if _is_self_attention(n, hm.tap(n).kind)]


def _is_self_attention(name: str, kind: str) -> bool:
    """A family's self-attention map ``<attention module>.hook_pattern`` (kind "self" or
    "window"), or a vizkit layer's own ``attn.hook_pattern`` HookPoint (no kind)."""
    if kind == "":
        return name.endswith(".attn.hook_pattern")
    return name.endswith(".hook_pattern") and kind in _SELF_KINDS


# maps a block multiplies with its values instead of its softmax map, by the layer that makes them
APPLIED_SUFFIXES = ("_mixed", "_refined")  # CaiT's talking heads; vizkit's RefinerAttention


def applied_attention_names(hm: HookedModel, layers: LayerSpec | None = None) -> list[str]:
    """Per block of ``layers``, the map it multiplies with the values: the talking-heads mixed
    (``attn.hook_pattern_mixed``) or refined (``attn.hook_pattern_refined``) map where the block
    has one, else its softmax map ``attn.hook_pattern``. Not row-stochastic in the first two
    cases."""
    known = set(hm.hook_names())
    applied = []
    for name in attention_names(hm, layers):
        found = [name + s for s in APPLIED_SUFFIXES if name + s in known]
        applied.append(found[0] if found else name)
    return applied


def grid_map(hm: HookedModel, name: str, pattern: Tensor, layout: TokenLayout) -> Tensor:
    """The map ``name`` as captured, over the tokens of ``layout``: window maps (B·nW, H, w², w²)
    are put back on the stage grid as (B, H, Np, Np), divided space-time maps on the clip's
    tokens as (B, H, N, N) (`vizkit.hooks.divided`); other maps are returned as they are."""
    tap = hm.tap(name)
    if tap.kind in _DIVIDED:
        return _DIVIDED[tap.kind](pattern, layout)
    if tap.kind != "window":
        return pattern
    if tap.geometry is None:
        raise ValueError(f"{name}: its family does not say how the block partitions its windows.")
    return windows_to_grid(pattern, layout.grid, tap.geometry())


def class_attention_names(hm: HookedModel) -> list[str]:
    """Class-attention maps (B, H, 1, N) of a class-attention stage (CaiT's
    ``blocks_token_only.{j}``, XCiT's ``cls_attn_blocks.{j}``); none for other models."""
    return [n for n in hm.hook_names() if hm.tap(n).kind == "class"]


def pooling_attention_names(hm: HookedModel) -> list[str]:
    """Attention-pooling heads' maps (B, H, Lq, N), e.g. SigLIP's ``attn_pool.hook_pattern``."""
    return [n for n in hm.hook_names() if hm.tap(n).kind == "pool"]


def layer_index(hm: HookedModel, name: str) -> int:
    """Position of the self-attention map ``name`` (or its ``_mixed``/``_refined``) among the
    model's self-attention layers."""
    return self_attention_names(hm).index(without_applied_suffix(name))


def without_applied_suffix(name: str) -> str:
    return next((name.removesuffix(s) for s in APPLIED_SUFFIXES if name.endswith(s)), name)


def query_index(layout: TokenLayout, query: str | int | tuple[int, ...]) -> int:
    """Token index of a query: ``"cls"`` (the first prefix token), a patch by grid coordinates
    ``(row, col)`` (a video's ``(frame, row, col)``, its token frame first), or a raw token
    index."""
    if isinstance(query, str):
        if query != "cls":
            raise ValueError(f"query must be 'cls', (row, col) or a token index; got {query!r}.")
        if not layout.class_token:
            raise ValueError(
                "query='cls' but these tokens have no class token (the model pools its "
                "patches, as Swin and SigLIP do; or its class token joins later, as in CaiT's "
                "class-attention stage: see class_attention()); choose a patch by its grid "
                f"coordinates, e.g. query={(0,) * len(layout.cells)}."
            )
        return 0
    if isinstance(query, tuple):
        cells, names = (
            layout.cells,
            ("row", "col") if layout.frames is None else ("frame", "row", "col"),
        )
        inside = len(query) == len(cells) and all(
            isinstance(q, int) and 0 <= q < n for q, n in zip(query, cells, strict=True)
        )
        if not inside:
            ranges = ", ".join(f"{a} 0..{n - 1}" for a, n in zip(names, cells, strict=True))
            raise ValueError(
                f"Patch {query} is outside the {'x'.join(map(str, cells))} grid ("
                f"({', '.join(names)}) with {ranges})."
            )
        flat = 0
        for q, n in zip(query, cells, strict=True):
            flat = flat * n + q
        return layout.num_prefix_tokens + flat
    if isinstance(query, int) and not isinstance(query, bool):
        if not 0 <= query < layout.num_tokens:
            raise ValueError(f"Token {query} is out of range 0..{layout.num_tokens - 1}.")
        return query
    raise TypeError(f"query must be 'cls', (row, col) or a token index; got {query!r}.")


def float_bytes(x: Tensor) -> int:
    """Bytes per element of the floating dtype activations will have for input ``x``."""
    return torch.finfo(x.dtype).bits // 8 if x.is_floating_point() else 4
