"""Hugging Face transformers' SAM image encoder (``SamVisionEncoder``; Kirillov et al. 2023,
"Segment Anything", Sec. 3 and App. A; found inside ``SamModel`` and ``SamVisionModel`` as
``vision_encoder``, or a module of your own).

A plain ViT without a class token, adapted as ViTDet (Li et al. 2022, "Exploring Plain Vision
Transformer Backbones for Object Detection", Sec. 3): the patch embedding gives a channels-last
(B, gh, gw, C) map (an absolute position embedding added after it), and the blocks
``layers.{i}`` keep that map. Most blocks attend inside non-overlapping w x w windows (the map
padded with zeros, after ``layer_norm1``, up to whole windows); the blocks in
``global_attn_indexes`` (``window_size`` 0) attend over the whole grid. Every attention adds
MViTv2's decomposed relative position bias (``use_rel_pos``): q·R_h + q·R_w, which depends on
the query. Each block is ``x + unpartition(attn(partition(layer_norm1(x))))``, then
``x + mlp(layer_norm2(x))``, without a module that closes a branch on the stream, so only its
stream ends are named (``hook_resid_pre``, ``hook_resid_post``, read as (B, Np, C)). The neck's
(B, C', gh, gw) output is ``hook_neck``.

Maps: recomputed from the attention's input as ``SamVisionAttention.forward`` computes them
(the sdpa class, the default, returns no weights; the eager one returns them as (B'·H, N, N)):

- global blocks: (B, H, Np, Np) over the raster grid (kind "self");
- windowed blocks: (B·nW, H, w², w²) over raster windows of raster tokens of the padded map
  (kind "window"), as the model's ``output_attentions`` gives them. The analyses put them on the
  grid as Swin's (`vizkit.hooks.windows`); where the window does not tile the grid (the padded
  keys' share has no place on the image; SAM ViT-B/L/H's 64 x 64 grid in 14 x 14 windows, and
  SAM takes one input size only) they refuse, and the maps stay readable as captured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...hooks.family import AttentionContext, BlockSite, Family, FamilyLayout, register_family
from ...hooks.layout import TokenLayout
from ...hooks.readers import ComputedReader
from ...hooks.sites import MAP_SHAPES
from ...hooks.taps import Tap, nchw_to_nlc, nhwc_to_nlc
from ...hooks.windows import WindowGeometry
from ..grids import conv_grid

__all__ = ["layout", "sam_pattern"]

_SAM = "transformers.models.sam.modeling_sam"


def layout(model: nn.Module) -> FamilyLayout:
    """``SamVisionEncoder``: ``patch_embed`` (B, gh, gw, C) as ``hook_embed`` (before the
    position embedding is added), the blocks ``layers.{i}`` on the patch grid, and ``neck``
    (B, C', gh, gw) as ``hook_neck``."""
    grid = conv_grid(model.patch_embed.projection)
    common = {"shape": "B Np C", "prefix_tokens": 0, "grid": grid}
    extra = [
        Tap("hook_embed", "patch_embed", **common, **nhwc_to_nlc),
        Tap("hook_neck", "neck", **common, **nchw_to_nlc),
    ]
    blocks = [
        BlockSite(f"layers.{i}", tokens="Np", prefix_tokens=0, grid=grid, channels_last=True)
        for i in range(len(model.layers))
    ]

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, grid(image_size), False)

    return FamilyLayout("sam", blocks, extra, tokens=tokens, reads_class_token=False)


def sam_pattern(attn: nn.Module, args: tuple, kwargs: dict, output: object) -> Tensor:
    """(B', H, hw, hw): ``SamVisionAttention``'s softmax map of its (B', h, w, C) input (B' =
    B·nW windows of h = w = window, or B over the whole grid), with its decomposed relative
    position bias, computed as its forward does (its layers run by their ``forward``, so their
    own hooks do not fire a second time)."""
    x = args[0] if args else kwargs["hidden_states"]
    batch, height, width, _ = x.shape
    heads, tokens = attn.num_attention_heads, height * width
    qkv = attn.qkv.forward(x).reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4)
    query, key, _ = qkv.reshape(3, batch * heads, tokens, -1).unbind(0)
    logits = (query * attn.scale) @ key.transpose(-2, -1)  # (B'·H, hw, hw)
    if attn.use_rel_pos:
        bias = attn.get_decomposed_rel_pos(
            query, attn.rel_pos_h, attn.rel_pos_w, (height, width), (height, width)
        )
        logits = logits + bias.reshape_as(logits)
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return weights.view(batch, heads, tokens, tokens)


def _site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """The block's map: in its windows (kind "window") or over the grid (kind "self"), the
    block's ``window_size`` (0: global) saying which."""
    window = int(getattr(context.block, "window_size", 0) or 0)
    common = {"prefix_tokens": 0, "grid": context.grid}
    read, name = ComputedReader(sam_pattern), f"{path}.hook_pattern"
    if window:
        return [Tap(name, path, read, kind="window", shape=MAP_SHAPES["window"],
                    geometry=_geometry(window, context), **common)]  # fmt: skip
    return [Tap(name, path, read, kind="self", shape="B H Np Np", **common)]


def _geometry(window: int, context: AttentionContext) -> Callable[[], WindowGeometry]:
    """The block's unshifted ``window`` x ``window`` windows, asked for where the analyses put
    its maps on the grid. SAM takes one input size only (its patch embedding refuses others),
    so where the windows do not tile that size's grid (SAM ViT-B/L/H: 64 x 64 patches in 14 x 14
    windows) no input makes them tile: refused here with that reason, not with the general
    advice to change the input size."""
    encoders = (m for m in context.model.modules() if hasattr(m, "patch_embed"))
    encoder = next((m for m in encoders if _holds(m, context.block)), None)
    size = getattr(getattr(encoder, "patch_embed", None), "image_size", None)

    def geometry() -> WindowGeometry:
        if size is not None and context.grid is not None:
            gh, gw = context.grid(tuple(size))
            if gh % window or gw % window:
                raise ValueError(
                    f"SAM's {gh}x{gw} patch grid is not a multiple of its {window}x{window} "
                    f"windows: the model pads each windowed block's map to whole windows, and "
                    "attention to the padded tokens has no place on the image, so these maps "
                    "cannot be put on the grid (rollout, attention maps over the image). SAM "
                    f"takes {size[0]}x{size[1]} inputs only, so no input size helps: read the "
                    "window maps as captured, run_with_cache(x, names='*hook_pattern') "
                    "((B·nW, H, w², w²)), the global blocks' maps alone, or use a gradient "
                    "method (gradcam, attnlrp)."
                )
        return WindowGeometry((window, window))

    return geometry


def _holds(encoder: nn.Module, block: nn.Module | None) -> bool:
    layers = getattr(encoder, "layers", None)
    return isinstance(layers, nn.ModuleList) and any(layer is block for layer in layers)


FAMILY = register_family(
    Family(
        "sam",
        "transformers",
        models={f"{_SAM}:SamVisionEncoder": layout},
        attention={f"{_SAM}:SamVisionAttention": _site},
    )
)
