"""Per-family adapters: which modules of a timm model are its transformer blocks, and the token
layout (prefix tokens, patch grid, channels-last) of each block's stream.

A family adapter returns `BlockSite`s and any extra taps (embedding, final norm, stage outputs);
`vizkit.hooks.adapters` turns each site into its residual and attention names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from timm.models import (
    beit,
    cait,
    convit,
    crossvit,
    eva,
    hiera,
    levit,
    maxxvit,
    mvitv2,
    naflexvit,
    pit,
    twins,
    xcit,
)
from timm.models import swin_transformer as swin
from timm.models import swin_transformer_v2 as swinv2
from timm.models import vision_transformer as vit
from timm.models import vision_transformer_relpos as relpos
from torch import nn

from .taps import GridFn, Tap, nhwc_to_nchw, nhwc_to_nlc

__all__ = ["BlockSite", "FamilyLayout", "family_layout"]


@dataclass(frozen=True)
class BlockSite:
    """One transformer block and the layout of its residual stream.

    Attributes:
        path: ``named_modules()`` path of the block.
        x_arg: which positional input is the stream (CaiT's class-attention blocks: 1).
        tokens: axis letter of the stream's tokens: "N" (prefix + patches), "Np" (patches only)
            or "1" (the class token alone).
        prefix_tokens: prefix tokens on that axis where it differs from the model's.
        grid: image (H, W) -> this block's token grid, where it differs from the patch embedding's.
        channels_last: the stream is (B, gh, gw, C); its names hold it as (B, Np, C).
        channels_first: the stream is (B, C, gh, gw) (LeViT's convolutional variant); its names
            hold it as (B, Np, C).
        input_grid: the grid of the block's input, where the block pools (MViTv2, Hiera).
    """

    path: str
    x_arg: int = 0
    tokens: str = "N"
    prefix_tokens: int | None = None
    grid: GridFn | None = None
    channels_last: bool = False
    channels_first: bool = False
    input_grid: GridFn | None = None


@dataclass
class FamilyLayout:
    """The blocks of a model and the taps outside them (embedding, final norm, stage outputs).

    ``merges_patches``: tokens mix between attention layers only through MLPs and 2 x 2 patch
    merging between stages (Swin), so rollout can follow them across stages."""

    family: str
    blocks: list[BlockSite] = field(default_factory=list)
    extra: list[Tap] = field(default_factory=list)
    merges_patches: bool = False


def _embed(path: str = "patch_embed", **layout) -> Tap:
    """The patch embedding's output: patches only, before any prefix token joins."""
    return Tap("hook_embed", path, shape="B Np C", **nhwc_to_nlc, **{"prefix_tokens": 0, **layout})


def _final_norm(model: nn.Module, path: str = "norm", **layout) -> list[Tap]:
    if getattr(model, path, None) is None:
        return []
    return [Tap("hook_final_norm", path, shape="B N C", **layout)]


def _vit(model: vit.VisionTransformer) -> FamilyLayout:
    late = getattr(model, "cls_insert_layer", 0)  # vizkit's LateClassTokenViT
    blocks = [
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0)
        if i < late  # before the class token joins
        else BlockSite(f"blocks.{i}")
        for i in range(len(model.blocks))
    ]
    return FamilyLayout("vit", blocks, [_embed(), *_final_norm(model)])


def _flat(family: str) -> Callable[[nn.Module], FamilyLayout]:
    """Families with one ``blocks`` list over [prefix, patches] (EVA, BEiT, relpos ViT)."""

    def layout(model: nn.Module) -> FamilyLayout:
        blocks = [BlockSite(f"blocks.{i}") for i in range(len(model.blocks))]
        return FamilyLayout(family, blocks, [_embed(), *_final_norm(model)])

    return layout


def _cait(model: cait.Cait) -> FamilyLayout:
    blocks = [
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0) for i in range(len(model.blocks))
    ]
    blocks += [  # forward(x_patches, x_cls): the stream is the class token
        BlockSite(f"blocks_token_only.{j}", x_arg=1, tokens="1", prefix_tokens=1)
        for j in range(len(model.blocks_token_only or ()))
    ]
    extra = [Tap("hook_embed", "patch_embed", shape="B Np C", prefix_tokens=0, **nhwc_to_nlc)]
    return FamilyLayout("cait", blocks, [*extra, *_final_norm(model)])


def _naflexvit(model: naflexvit.NaFlexVit) -> FamilyLayout:
    """NaFlexViT on an image batch (B, C, H, W): one (H / ph, W / pw) grid for every image. Its
    NaFlex input (a dict of patches with per-image grids and padding) is refused by
    `vizkit.hooks.validate_input`."""
    pad = getattr(model.embeds, "dynamic_img_pad", False)  # padded up to whole patches
    grid = _divided(model.embeds.patch_size[0], ceil=pad)
    prefix = model.num_prefix_tokens
    blocks = [
        BlockSite(f"blocks.{i}", prefix_tokens=prefix, grid=grid) for i in range(len(model.blocks))
    ]
    return FamilyLayout("naflexvit", blocks, _final_norm(model, prefix_tokens=prefix, grid=grid))


def _xcit(model: xcit.Xcit) -> FamilyLayout:
    grid = _divided(model.patch_embed.patch_size, ceil=True)  # stride-2 padded convolutions
    blocks = [  # XCA blocks hold patches only; the class token joins for class attention
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid)
        for i in range(len(model.blocks))
    ]
    blocks += [
        BlockSite(f"cls_attn_blocks.{j}", prefix_tokens=1, grid=grid)
        for j in range(len(model.cls_attn_blocks))
    ]
    return FamilyLayout("xcit", blocks, _final_norm(model, prefix_tokens=1, grid=grid))


def _swin(model: nn.Module) -> FamilyLayout:
    """Swin and Swin V2: ``layers.{s}`` merge 2x2 patches first (s > 0), then run blocks on a
    channels-last (B, gh, gw, C) map; the stage grid is the patch grid halved (rounded up)."""
    blocks, extra, scale = [], [_embed(prefix_tokens=0)], 1
    for s, stage in enumerate(model.layers):
        scale *= 1 if isinstance(stage.downsample, nn.Identity) else 2
        grid = _scaled_patch_grid(model, scale)
        blocks += [
            BlockSite(f"layers.{s}.blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid,
                      channels_last=True)
            for i in range(len(stage.blocks))
        ]  # fmt: skip
        extra.append(Tap(f"layers.{s}.hook_out", f"layers.{s}", shape="B C gh gw", **nhwc_to_nchw))
    extra.append(
        Tap("hook_final_norm", "norm", shape="B Np C", prefix_tokens=0, grid=grid, **nhwc_to_nlc)
    )
    return FamilyLayout("swin", blocks, extra, merges_patches=True)


def _pit(model: pit.PoolingVisionTransformer) -> FamilyLayout:
    """PiT: stage s pools the (B, C, gh, gw) map by 2 (a stride-2 depthwise convolution, grid
    rounded up) and runs ViT blocks on [class (+ distillation), patches]."""
    conv, prefix = model.patch_embed.conv, model.cls_token.shape[1]
    blocks = []
    for s, stage in enumerate(model.transformers):
        grid = _conv_grid(conv, 2**s)
        blocks += [
            BlockSite(f"transformers.{s}.blocks.{i}", prefix_tokens=prefix, grid=grid)
            for i in range(len(stage.blocks))
        ]
    return FamilyLayout("pit", blocks, [])


def _twins(model: twins.Twins) -> FamilyLayout:
    """Twins: four stages, each with its own patch embedding (no prefix tokens)."""
    blocks, size = [], 1
    for s, stage in enumerate(model.blocks):
        size *= model.patch_embeds[s].patch_size[0]
        grid = _divided(size)
        blocks += [BlockSite(f"blocks.{s}.{i}", tokens="Np", prefix_tokens=0, grid=grid)
                   for i in range(len(stage))]  # fmt: skip
    return FamilyLayout("twins", blocks, [])


def _crossvit(model: crossvit.CrossVit) -> FamilyLayout:
    """CrossViT: per multi-scale block, each branch's ViT blocks over [class, patches]."""
    blocks = []
    for m, multi in enumerate(model.blocks):
        for b, branch in enumerate(multi.blocks):
            pe = model.patch_embed[b]
            grid = _crossvit_grid(
                model, b, [s // p for s, p in zip(pe.img_size, pe.patch_size, strict=True)]
            )
            blocks += [
                BlockSite(f"blocks.{m}.blocks.{b}.{i}", prefix_tokens=1, grid=grid)
                for i in range(len(branch))
            ]
    return FamilyLayout("crossvit", blocks, [])


def _crossvit_grid(model: crossvit.CrossVit, branch: int, size) -> GridFn:
    """A branch's fixed grid. The model resizes the image to the branch's size, so the grid
    covers the whole image, except with ``crop_scale``, where it covers only a centre crop."""
    fixed = tuple(int(s) for s in size)
    scaled = tuple(model.img_size_scaled[branch])

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        if model.crop_scale and tuple(image_size) != scaled:
            raise ValueError(
                f"CrossViT with crop_scale=True shows branch {branch} only the centre "
                f"{scaled[0]}x{scaled[1]} crop of a {image_size[0]}x{image_size[1]} image, so its "
                f"tokens cannot be drawn over the whole image; use {scaled[0]}x{scaled[1]} images."
            )
        return fixed

    return grid


def _maxvit(model: maxxvit.MaxxVit) -> FamilyLayout:
    """MaxViT / MaxxViT: attention blocks are ``attn_block`` (local windows) and ``attn_grid``
    (dilated grid) of each stage block; their stream is channels-last (B, gh, gw, C) at the
    stage's reduction (timm ``feature_info``; padded convolutions round up)."""
    reductions = {f["module"]: f["reduction"] for f in model.feature_info}
    blocks = []
    for s, stage in enumerate(model.stages):
        grid = _divided(reductions[f"stages.{s}"], ceil=True)
        for i, block in enumerate(stage.blocks):
            for part in ("attn_block", "attn_grid"):
                if isinstance(getattr(block, part, None), maxxvit.PartitionAttentionCl):
                    blocks.append(
                        BlockSite(f"stages.{s}.blocks.{i}.{part}", tokens="Np", prefix_tokens=0,
                                  grid=grid, channels_last=True)
                    )  # fmt: skip
    return FamilyLayout("maxvit", blocks, [])


def _convit(model: convit.ConVit) -> FamilyLayout:
    """ConViT: GPSA blocks over patches only, then the class token joins (``local_up_to_layer``)."""
    blocks = [
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0)
        if i < model.local_up_to_layer
        else BlockSite(f"blocks.{i}", prefix_tokens=1)
        for i in range(len(model.blocks))
    ]
    return FamilyLayout("convit", blocks, [_embed(prefix_tokens=0), *_final_norm(model)])


def _levit(model: levit.Levit) -> FamilyLayout:
    """LeViT: a stride-16 stem, then stages whose downsampling attention halves the grid
    (r -> (r - 1) // 2 + 1); no prefix tokens."""
    blocks, halvings = [], 0
    for s, stage in enumerate(model.stages):
        halvings += not isinstance(stage.downsample, nn.Identity)
        grid = _halved(_divided(model.stem.stride), halvings)
        blocks += [
            BlockSite(f"stages.{s}.blocks.{i}", tokens="Np", prefix_tokens=0, grid=grid,
                      channels_first=model.use_conv)
            for i in range(len(stage.blocks))
        ]  # fmt: skip
    return FamilyLayout("levit", blocks, [])


def _mvit(model: mvitv2.MultiScaleVit) -> FamilyLayout:
    """MViTv2: blocks that pool their queries (stride s) shrink the grid to ceil(g / s); the
    class token (``*_cls`` models) rides along."""
    prefix, grid, blocks = model.num_prefix_tokens, _divided(4, ceil=True), []
    for s, stage in enumerate(model.stages):
        for i, block in enumerate(stage.blocks):
            before = grid
            pool = block.attn.pool_q
            if pool is not None and tuple(pool.stride) != (1, 1):
                grid = _halved(grid, 1, stride=pool.stride[0])
            blocks.append(
                BlockSite(f"stages.{s}.blocks.{i}", prefix_tokens=prefix, grid=grid,
                          input_grid=before)
            )  # fmt: skip
    return FamilyLayout("mvitv2", blocks, [])


def _hiera(model: hiera.Hiera) -> FamilyLayout:
    """Hiera: tokens are unrolled (mask units first) until the last stage; only raster blocks
    get a grid, the others refuse one (`_unrolled`)."""
    blocks, schedule = [], model.reroll.schedule
    for i in range(len(model.blocks)):
        blocks.append(
            BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0,
                      grid=_hiera_grid(schedule[i]), input_grid=_hiera_grid(schedule.get(i - 1)))
        )  # fmt: skip
    return FamilyLayout("hiera", blocks, [])


def _hiera_grid(schedule) -> GridFn:
    if schedule is None:  # block 0's input: the patch embedding, unrolled
        schedule = ([(2, 2)], None)

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        steps, size = schedule
        if steps:
            raise ValueError(
                "Hiera holds these tokens in its unrolled order (mask units first), not on a "
                "raster grid, so they cannot be drawn as a map; only its last stage is raster. "
                "Use the last block (blocks.-1), or Hiera's own model.reroll(x, block_index)."
            )
        return tuple(size)

    return grid


# -- grids ---------------------------------------------------------------------------------


def _scaled_patch_grid(model: nn.Module, scale: int) -> GridFn:
    """The patch embedding's grid for an input size, divided by ``scale`` (rounded up)."""
    pe = model.patch_embed

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        if getattr(pe, "strict_img_size", True) and not getattr(model, "dynamic_img_size", False):
            base = pe.grid_size
        else:
            base = pe.dynamic_feat_size(tuple(image_size))
        return tuple(-(-int(g) // scale) for g in base)

    return grid


def _conv_grid(conv: nn.Conv2d, scale: int) -> GridFn:
    """The output grid of ``conv`` for an input size, divided by ``scale`` (rounded up)."""

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        out = [
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, s, p, d in zip(
                image_size, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                strict=True,
            )
        ]  # fmt: skip
        return tuple(-(-o // scale) for o in out)

    return grid


def _divided(stride: int, ceil: bool = False) -> GridFn:
    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        return tuple(
            -(-int(size) // stride) if ceil else int(size) // stride for size in image_size
        )

    return grid


def _halved(base: GridFn, times: int, stride: int = 2) -> GridFn:
    """``base`` divided by ``stride`` ``times``, rounding up (a padded stride-s convolution or
    subsampling: r -> (r - 1) // s + 1)."""

    def grid(image_size: tuple[int, int]) -> tuple[int, int]:
        out = base(image_size)
        for _ in range(times):
            out = tuple((g - 1) // stride + 1 for g in out)
        return out

    return grid


_FAMILIES: list[tuple[type, Callable[[nn.Module], FamilyLayout]]] = [
    (vit.VisionTransformer, _vit),
    (cait.Cait, _cait),
    (eva.Eva, _flat("eva")),
    (beit.Beit, _flat("beit")),
    (relpos.VisionTransformerRelPos, _flat("relpos")),
    (naflexvit.NaFlexVit, _naflexvit),
    (xcit.Xcit, _xcit),
    (swin.SwinTransformer, _swin),
    (swinv2.SwinTransformerV2, _swin),
    (pit.PoolingVisionTransformer, _pit),
    (twins.Twins, _twins),
    (crossvit.CrossVit, _crossvit),
    (maxxvit.MaxxVit, _maxvit),
    (convit.ConVit, _convit),
    (levit.Levit, _levit),
    (mvitv2.MultiScaleVit, _mvit),
    (hiera.Hiera, _hiera),
]


def family_layout(model: nn.Module) -> FamilyLayout | None:
    """The blocks and extra taps of ``model``'s family, or None for other models."""
    for cls, layout in _FAMILIES:
        if isinstance(model, cls):
            return layout(model)
    return None
