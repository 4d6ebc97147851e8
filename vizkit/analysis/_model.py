"""Shared plumbing of the analyses: wrap the model, move the batch, find attention layers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..hooks import HookedModel, TokenLayout

__all__ = [
    "as_hooked",
    "applied_attention_names",
    "attention_names",
    "class_attention_names",
    "eval_mode",
    "float_bytes",
    "layer_index",
    "model_patch_size",
    "on_model_device",
    "query_index",
]

_SELF_ATTENTION = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern$")
_ANY_PATTERN = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern")


def as_hooked(model: nn.Module | HookedModel) -> HookedModel:
    """``model`` itself if it is a HookedModel, else a new HookedModel around it."""
    return model if isinstance(model, HookedModel) else HookedModel(model)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (dropout, DropPath off) inside the context; every module's training
    flag is restored on exit, also after an exception."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


def on_model_device(hm: HookedModel, x: Tensor) -> Tensor:
    """The batch on the device of the model's first parameter (or unchanged without any)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"Expected an image batch tensor (B, C, H, W); got {type(x).__name__}.")
    parameter = next(hm.model.parameters(), None)
    return x if parameter is None else x.to(parameter.device)


def model_patch_size(hm: HookedModel) -> tuple[int, int]:
    """(ph, pw) of the model's patch embedding."""
    return tuple(int(p) for p in hm.model.patch_embed.patch_size)


def attention_names(hm: HookedModel, layers: int | list[int] | None = None) -> list[str]:
    """Names of the self-attention patterns ``blocks.{i}.attn.hook_pattern`` of ``layers``
    (None: all; negative indices count from the end), in forward order."""
    names = [n for n in hm.hook_names() if _SELF_ATTENTION.match(n)]
    if not names:
        raise ValueError(
            f"{type(hm.model).__name__} has no self-attention patterns "
            "(blocks.{i}.attn.hook_pattern): attention analyses need a ViT-family model "
            "(timm VisionTransformer, Cait or a vizkit model). For CNNs use gradcam()."
        )
    if layers is None:
        return names
    chosen = [layers] if isinstance(layers, int) else list(layers)
    if not chosen:
        raise ValueError("layers is empty; pass None for all layers or some layer indices.")
    depth = len(names)
    for layer in chosen:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -depth <= layer < depth:
            raise ValueError(
                f"Layer {layer!r} does not exist: the model has {depth} attention layers "
                f"(valid: 0..{depth - 1} or -{depth}..-1)."
            )
    return [names[layer % depth] for layer in chosen]


# maps a block multiplies with its values instead of its softmax map, by the layer that makes them
APPLIED_SUFFIXES = ("_mixed", "_refined")  # CaiT's talking heads; vizkit's RefinerAttention


def applied_attention_names(hm: HookedModel, layers: int | list[int] | None = None) -> list[str]:
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


def class_attention_names(hm: HookedModel) -> list[str]:
    """CaiT's class-attention patterns ``blocks_token_only.{j}.attn.hook_pattern`` (none for
    other models)."""
    return [
        n
        for n in hm.hook_names()
        if n.startswith("blocks_token_only.") and n.endswith(".attn.hook_pattern")
    ]


def layer_index(name: str) -> int:
    """The block index in ``blocks.{i}.attn.hook_pattern`` (or its ``_mixed``/``_refined``)."""
    return int(_ANY_PATTERN.match(name).group(1))


def query_index(layout: TokenLayout, query: str | int | tuple[int, int]) -> int:
    """Token index of a query: ``"cls"`` (the first prefix token), a patch by grid coordinates
    ``(row, col)``, or a raw token index."""
    if isinstance(query, str):
        if query != "cls":
            raise ValueError(f"query must be 'cls', (row, col) or a token index; got {query!r}.")
        if not layout.class_token:
            raise ValueError(
                "query='cls' but these tokens have no class token (CaiT's class token "
                "appears only in its class-attention stage: see class_attention()); choose a "
                "patch by its grid coordinates, e.g. query=(0, 0)."
            )
        return 0
    if isinstance(query, tuple):
        (gh, gw), (row, col) = layout.grid, query
        if not (0 <= row < gh and 0 <= col < gw):
            raise ValueError(
                f"Patch {query} is outside the {gh}x{gw} grid (rows 0..{gh - 1}, cols 0..{gw - 1})."
            )
        return layout.num_prefix_tokens + row * gw + col
    if isinstance(query, int) and not isinstance(query, bool):
        if not 0 <= query < layout.num_tokens:
            raise ValueError(f"Token {query} is out of range 0..{layout.num_tokens - 1}.")
        return query
    raise TypeError(f"query must be 'cls', (row, col) or a token index; got {query!r}.")


def float_bytes(x: Tensor) -> int:
    """Bytes per element of the floating dtype activations will have for input ``x``."""
    return torch.finfo(x.dtype).bits // 8 if x.is_floating_point() else 4
