"""Hugging Face transformers' SAM2 image encoder (``Sam2HieraDetModel``; found inside
``Sam2VisionModel`` as ``backbone`` and ``Sam2Model``, or a module of your own).

Blocks ``blocks.{i}`` hold a channels-last (B, h, w, C) map in raster order, as timm's
``hieradet_sam2`` (`vizkit.families.timm.hieradet_sam2`): windowed or global attention, queries
and shortcut max-pooled (``query_stride``, rounding down) in the first block of a pooling stage.
The blocks add both branches without a module that closes them, so only their stream ends are
named (``hook_resid_pre``, ``hook_resid_post``).

Maps: recomputed from the attention's input as its forward computes them (its attention
function's weights are not returned), and put in image space as timm's.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import Tensor, nn

from ...hooks.family import Family, FamilyLayout, register_family
from ...hooks.taps import Tap, nhwc_to_nlc
from ..grids import conv_grid
from ..timm.hieradet_sam2 import sam2_layout, sam2_site

__all__ = ["layout", "sam2_pattern"]

_SAM2 = "transformers.models.sam2.modeling_sam2"


def layout(model: nn.Module) -> FamilyLayout:
    """``Sam2HieraDetModel``: ``patch_embed`` (B, h, w, C) as ``hook_embed``, then
    ``blocks.{i}``."""
    base = conv_grid(model.patch_embed.projection)
    extra = [Tap("hook_embed", "patch_embed", shape="B Np C", prefix_tokens=0, grid=base,
                 **nhwc_to_nlc)]  # fmt: skip
    return sam2_layout("sam2", base, [block.query_stride for block in model.blocks], extra)


def sam2_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B', H, Nq, N): ``Sam2MultiScaleAttention``'s map of its (B', h, w, C) input, queries
    max-pooled by ``query_stride`` with the library's own ``do_pool``."""
    x = args[0] if args else kwargs["hidden_states"]
    batch, height, width, _ = x.shape
    heads = attn.num_attention_heads
    q, k, _ = attn.qkv(x).reshape(batch, height * width, 3, heads, -1).unbind(2)
    if attn.query_stride:
        q = _library(attn).do_pool(q.reshape(batch, height, width, -1), attn.query_stride)
        q = q.reshape(batch, -1, heads, k.shape[-1])
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    return ((q * attn.scale) @ k.transpose(-1, -2)).softmax(-1)


def _library(module: nn.Module):
    return sys.modules[type(module).__module__]


def _windows(block: nn.Module, x: Tensor) -> Tensor:
    """The attention's input: ``layer_norm1(x)`` partitioned by the library's
    ``window_partition`` (which pads), the norm run by its ``forward`` (its own hooks do not
    fire a second time)."""
    windows, _ = _library(block).window_partition(block.layer_norm1.forward(x), block.window_size)
    return windows


FAMILY = register_family(
    Family(
        "sam2",
        "transformers",
        models={f"{_SAM2}:Sam2HieraDetModel": layout},
        attention={
            f"{_SAM2}:Sam2MultiScaleAttention": sam2_site(
                lambda block: (block.window_size,) * 2 if block.window_size else None,
                lambda block: block.query_stride,
                sam2_pattern,
                _windows,
            )
        },
    )
)
