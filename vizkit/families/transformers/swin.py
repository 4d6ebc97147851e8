"""Hugging Face transformers' Swin and Swin V2 (``SwinModel``, ``Swinv2Model``; found inside
``SwinForImageClassification``, ``Swinv2ForImageClassification``, the masked-image-modeling
models and the backbones, or a module of your own).

The blocks ``encoder.layers.{s}.blocks.{i}`` hold the stream as (B, Np, C) on their stage's grid
(the patch grid, padded up to whole patches, halved rounding up once per earlier stage), and
return a tuple whose first item is the stream. Unlike timm, a stage merges 2 x 2 patches at its
end (``downsample``), so stage s + 1 runs on the merged grid; rollout follows the merging
(`FamilyLayout.merges_patches`).

Swin (transformers 5): pre-norm, ``x + drop_path(attention(layernorm_before(x)))`` (the window
attention's output put back on the grid), then ``x + dropout(mlp(layernorm_after(x)))``. The
module ``dropout`` closes both branches, but its first call is on the windows (B·nW, w², C), not
on the stream, so ``hook_mlp_out`` is read at the ``mlp`` output: the branch itself wherever
``dropout`` is the identity (eval mode, or ``hidden_dropout_prob = 0``, the default). Its
``SwinAttention`` calls transformers' attention interface and returns ``(output, weights)``;
the window maps (B·nW, H, w², w²) are those weights under eager attention, switched per call as
for ViT (`vizkit.families.transformers.common.eager_attention`), and its relative position bias
is the output of its ``relative_position_bias`` module.

Swin V2: post-norm, ``x + drop_path(layernorm_before(attention(x)))``, then
``x + drop_path(layernorm_after(mlp(x)))`` with one ``drop_path`` module for both branches (its
first and second call). ``Swinv2SelfAttention`` (``...attention.self``) computes its map itself
(cosine attention, eager only: transformers offers no sdpa for Swin V2) and hands it to its
``dropout`` child, where it is read and may be edited; its position bias is recomputed from the
continuous-position-bias MLP as the module computes it.

Windows: transformers partitions the (cyclically shifted) grid into raster-ordered windows of
raster-ordered tokens, the order `vizkit.hooks.windows.window_token_index` expects. Each block's
window and shift are read from the block when asked: Swin sets them in every forward
(``set_shift_and_window_size``: a grid no larger than the window gets one window of the grid's
side and no shift; the change stays on the block), Swin V2 at construction from the configured
image size (``_compute_window_shift``). Read after the forward that made the maps, they are the
ones that forward used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...hooks.family import (
    AttentionContext,
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    register_family,
)
from ...hooks.layout import TokenLayout
from ...hooks.readers import ComputedReader, ExplicitPathReader, OutputReader
from ...hooks.sites import MAP_SHAPES, captured
from ...hooks.taps import GridFn, Tap, windows_to_batch
from ...hooks.windows import WindowGeometry
from .common import attention_config, eager_attention

__all__ = ["layout", "stage_grid"]

_SWIN = "transformers.models.swin.modeling_swin"
_SWINV2 = "transformers.models.swinv2.modeling_swinv2"


def stage_grid(patch_size: int | tuple[int, int], stage: int) -> GridFn:
    """Image (H, W) -> the token grid of ``stage``: the patch grid (the image padded up to whole
    patches) halved, rounding up, once per earlier stage's patch merging."""
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        gh, gw = -(-int(image_size[0]) // ph), -(-int(image_size[1]) // pw)
        for _ in range(stage):
            gh, gw = (gh + 1) // 2, (gw + 1) // 2
        return gh, gw

    return grid


def layout(model: nn.Module) -> FamilyLayout:
    """``SwinModel`` / ``Swinv2Model``: ``embeddings``, ``encoder.layers.{s}.blocks.{i}``,
    ``layernorm``; the stage outputs (after their patch merging) as
    ``encoder.layers.{s}.hook_out``."""
    patch = model.embeddings.patch_embeddings.patch_size
    first = stage_grid(patch, 0)
    blocks: list[BlockSite] = []
    extra = [
        Tap("hook_embed", "embeddings", OutputReader(0), shape="B Np C", prefix_tokens=0,
            grid=first)
    ]  # fmt: skip
    grid = first
    for s, stage in enumerate(model.encoder.layers):
        grid = stage_grid(patch, s)
        blocks += [
            BlockSite(f"encoder.layers.{s}.blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid)
            for i in range(len(stage.blocks))
        ]
        merged = stage_grid(patch, s + 1) if stage.downsample is not None else grid
        extra.append(
            Tap(f"encoder.layers.{s}.hook_out", f"encoder.layers.{s}", OutputReader(0),
                shape="B Np C", prefix_tokens=0, grid=merged)
        )  # fmt: skip
        grid = merged
    extra.append(Tap("hook_final_norm", "layernorm", shape="B Np C", prefix_tokens=0, grid=grid))

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, first(image_size), False)

    return FamilyLayout(
        "swin", blocks, extra, merges_patches=True, tokens=tokens, reads_class_token=False
    )


def _geometry(block: nn.Module) -> Callable[[], WindowGeometry]:
    """The block's window and shift, read when asked (see the module docstring)."""

    def geometry() -> WindowGeometry:
        window, shift = int(block.window_size), int(block.shift_size)
        return WindowGeometry((window, window), (shift, shift))

    return geometry


def _bias_output(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """Swin's ``relative_position_bias`` module returns (1, H, w², w²): -> (H, w², w²)."""
    return output.reshape(output.shape[-3:])


def _returned_windows(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``SwinAttention``: the window maps it returns beside its output under eager attention
    (read-only, as `vizkit.families.transformers.common.returned_map`), and its bias."""
    config = attention_config(attn)
    read = ExplicitPathReader.returned(lambda: eager_attention(config))
    taps = [
        Tap(f"{path}.hook_pattern", path, read, kind="window", shape=MAP_SHAPES["window"],
            prefix_tokens=context.prefix_tokens, grid=context.grid,
            geometry=_geometry(context.block), **windows_to_batch)
    ]  # fmt: skip
    if getattr(attn, "relative_position_bias", None) is not None:
        taps.append(
            Tap(f"{path}.hook_pos_bias", f"{path}.relative_position_bias",
                ComputedReader(_bias_output), kind="position", shape="H w² w²")
        )  # fmt: skip
    return taps


def _swinv2_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, w², w²): 16 sigmoid(MLP(log-spaced relative coordinates)), as
    ``Swinv2SelfAttention.forward`` computes it (the MLP's layers run by their ``forward``, so
    their own hooks do not fire a second time)."""
    table = attn.relative_coords_table
    for layer in attn.continuous_position_bias_mlp:
        table = layer.forward(table)
    table = table.view(-1, attn.num_attention_heads)
    area = attn.window_size[0] * attn.window_size[1]
    bias = table[attn.relative_position_index.view(-1)].view(area, area, -1)
    return 16 * torch.sigmoid(bias.permute(2, 0, 1).contiguous())


_SWINV2_WINDOWS = captured(
    "window",
    child="dropout",
    position=_swinv2_bias,
    has_position=lambda attn, context: True,
    geometry=lambda block, attn: _geometry(block),
)

# x + drop_path(attention(layernorm_before(x))); x + dropout(mlp(layernorm_after(x)))
_SWIN_LAYER = ResidualSpec("drop_path", "mlp", "layernorm_after", output_item=0)
# x + drop_path(layernorm_before(attention(x))); x + drop_path(layernorm_after(mlp(x)))
_SWINV2_LAYER = ResidualSpec("drop_path", "drop_path", "intermediate", output_item=0)

FAMILY = register_family(
    Family(
        "swin",
        "transformers",
        models={f"{_SWIN}:SwinModel": layout, f"{_SWINV2}:Swinv2Model": layout},
        blocks={f"{_SWIN}:SwinLayer": _SWIN_LAYER, f"{_SWINV2}:Swinv2Layer": _SWINV2_LAYER},
        attention={
            f"{_SWIN}:SwinAttention": _returned_windows,
            f"{_SWINV2}:Swinv2SelfAttention": _SWINV2_WINDOWS,
        },
    )
)
