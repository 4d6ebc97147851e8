"""Per-architecture adapters: the canonical hook names of a model and the module site of each.

Every model gets ``<path>.hook_out`` for each submodule's output (so CNNs work for Grad-CAM and
CKA) and each vizkit `HookPoint` under its own path. Transformer families known to
`vizkit.hooks.families` additionally get the residual-stream and attention names of each block;
those replace the ``hook_out`` of the module they are read from, so every activation has exactly
one name.

Shapes (axis letters: B batch, H heads, N tokens incl. prefix, Np patches, C channels, w window
side, nW windows per image):

=================================  =====================================  ================
name                               read from (timm 1.0)                   shape
=================================  =====================================  ================
hook_embed                         ``patch_embed`` output (NHWC flattened) (B, Np, C)
{block}.hook_resid_pre             the block's input                       (B, N, C)
{block}.attn.hook_pattern          ``attn.attn_drop`` output, fused off    (B, H, N, N)
{block}.attn.hook_pos_bias         the relative position bias it adds      (H, N, N)
{block}.attn.hook_content_pattern  EVA with RoPE: the map unrotated        (B, H, N, N)
{block}.hook_attn_out              ``drop_path1`` output (after ``ls1``)   (B, N, C)
{block}.hook_resid_mid             ``norm2`` input (``mlp`` if post-norm)  (B, N, C)
{block}.hook_mlp_out               ``drop_path2`` output (after ``ls2``)   (B, N, C)
{block}.hook_resid_post            the block's output                      (B, N, C)
hook_final_norm                    ``norm`` output                         (B, N, C)
attn_pool.hook_pattern             SigLIP's pooling head, recomputed       (B, H, Lq, N)
=================================  =====================================  ================

``{block}`` is the block's module path: ``blocks.{i}`` (ViT, DeiT, DINOv2, EVA, DINOv3, BEiT,
relpos ViT, NaFlexViT, XCiT), ``layers.{s}.blocks.{i}`` (Swin, Swin V2: the stream is held as
(B, Np, C) on the stage grid, windows as captured (B·nW, H, w², w²)),
``transformers.{s}.blocks.{i}`` (PiT), ``blocks.{s}.{i}`` (Twins), ``blocks.{m}.blocks.{b}.{i}``
(CrossViT), ``stages.{s}.blocks.{i}.attn_block`` / ``.attn_grid`` (MaxViT). What each map is
(self, window, pooled, class, pool, cross, channel) is `Tap.kind`; see
`vizkit.hooks.taps.PATTERN_KINDS`. Models of other families get ``<path>.hook_pattern`` for each
attention module with timm's ``attn_drop`` site, as captured (kind "unplaced").

CaiT: ``blocks.{i}`` (self-attention stage) hold patch tokens only (N = Np, no prefix);
``blocks.{i}.attn.hook_pattern`` is the post-softmax map S (row-stochastic, read at the input of
``proj_w``) and ``blocks.{i}.attn.hook_pattern_mixed`` the talking-heads map after ``proj_w``
(not row-stochastic). The class-attention stage ``blocks_token_only.{j}`` carries the class
token: resid names are (B, 1, C) and ``attn.hook_pattern`` is (B, H, 1, 1 + Np), the class token's
attention over itself and every patch. CaiT's branches multiply by ``gamma_1``/``gamma_2``
(parameters, not modules) and share one ``drop_path`` module, so ``hook_attn_out`` and
``hook_mlp_out`` are its first and second call. XCiT's XCA maps are over channels:
``blocks.{i}.attn.hook_channel_pattern`` (B, H, C/H, C/H); its token maps are the class attention
of ``cls_attn_blocks.{j}``.
"""

from __future__ import annotations

from timm.layers import AttentionPoolLatent
from timm.layers.bottleneck_attn import BottleneckAttn
from timm.models import (
    coat,
    cpubone,
    crossvit,
    efficientformer,
    efficientformer_v2,
    efficientvit_msra,
    hieradet_sam2,
    levit,
    lowformer,
    shvit,
    tiny_vit,
)
from torch import nn

from .blocks import attention_taps, block_taps
from .derived import (
    biased_attention_pattern,
    bottleneck_pattern,
    cascaded_group_pattern,
    conv_attention_pattern,
    pooled_query_pattern,
    single_head_pattern,
)
from .families import FamilyLayout, family_layout
from .hook_point import HookPoint
from .taps import Tap

__all__ = ["build_taps"]

_CONTAINERS = (nn.ModuleList, nn.ModuleDict)
# modules whose 4-D output is channels-first by definition (B, C, h, w)
_CHANNELS_FIRST = (
    nn.Conv2d,
    nn.ConvTranspose2d,
    nn.BatchNorm2d,
    nn.InstanceNorm2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
)


def build_taps(model: nn.Module, layout: FamilyLayout | None = None) -> list[Tap]:
    """All taps of ``model`` in module order (inputs before, outputs after a module's children);
    ``layout``: its `family_layout`, where the caller has it already."""
    special = _architecture_taps(model, layout or family_layout(model))
    inputs: dict[str, list[Tap]] = {}
    outputs: dict[str, list[Tap]] = {}
    derived: dict[str, list[Tap]] = {}  # values computed beside a module's output
    for tap in special:
        site = derived if tap.compute else inputs if tap.site == "input" else outputs
        site.setdefault(tap.module, []).append(tap)

    taps: list[Tap] = []
    seen: set[int] = set()

    def visit(path: str, module: nn.Module) -> None:
        if id(module) in seen:
            return
        seen.add(id(module))
        taps.extend(inputs.get(path, ()))
        for child_name, child in module.named_children():
            visit(f"{path}.{child_name}" if path else child_name, child)
        if not path:
            return
        if path in outputs:
            taps.extend(outputs[path])
        elif isinstance(module, HookPoint):
            taps.append(Tap(name=path, module=path))
        elif not isinstance(module, _CONTAINERS):
            shape = "B C h w" if isinstance(module, _CHANNELS_FIRST) else ""
            taps.append(Tap(name=f"{path}.hook_out", module=path, shape=shape))
        taps.extend(derived.get(path, ()))

    visit("", model)
    return taps


def _architecture_taps(model: nn.Module, layout: FamilyLayout | None) -> list[Tap]:
    """Residual and attention taps of every block of a known family, and the attention maps of
    known attention modules outside blocks (SigLIP's pooling head, CrossViT's fusion)."""
    if layout is None:
        return _unplaced_patterns(model)
    taps: list[Tap] = list(layout.extra)
    inside: set[str] = set()
    shared = any(getattr(model, a, None) is not None for a in ("rel_pos_bias", "shared_rel_pos"))
    rotary = getattr(model, "rope", None) is not None
    for site in layout.blocks:
        block = model.get_submodule(site.path)
        taps += block_taps(
            site.path, block, x_arg=site.x_arg, shape=f"B {site.tokens} C",
            prefix_tokens=site.prefix_tokens, grid=site.grid, channels_last=site.channels_last,
            input_grid=site.input_grid, channels_first=site.channels_first,
        )  # fmt: skip
        class_stream = site.tokens == "1"  # its maps read [class, patches], not the stream
        for name, module in block.named_modules(prefix=site.path):
            inside.add(name)
            taps += attention_taps(
                name, module, tokens=site.tokens,
                prefix_tokens=None if class_stream else site.prefix_tokens,
                grid=None if class_stream else site.grid, shared_position=shared, rotary=rotary,
            )  # fmt: skip
    for name, module in model.named_modules():
        if name and name not in inside and isinstance(module, _OUTSIDE_BLOCKS):
            pooled_prefix = 0 if getattr(model, "pool_include_prefix", True) is False else None
            last = layout.blocks[-1] if layout.blocks else None  # the tokens the head reads
            taps += attention_taps(
                name, module, prefix_tokens=pooled_prefix if last is None or pooled_prefix == 0
                else last.prefix_tokens, grid=last.grid if last is not None else None,
            )  # fmt: skip
    return taps


def _unplaced_patterns(model: nn.Module) -> list[Tap]:
    """For families vizkit has no adapter for: every attention module (one with q/k/v
    projections) with timm's ``attn_drop`` site, or an ``nn.Softmax`` child, gets
    ``<path>.hook_pattern`` as captured (kind "unplaced": the token layout is unknown, so
    analyses that need it refuse)."""
    taps = []
    for name, module in model.named_modules():
        if type(module) in _RECOMPUTED_UNPLACED:
            compute = _RECOMPUTED_UNPLACED[type(module)]
            taps.append(Tap(f"{name}.hook_pattern", name, compute=compute, kind="unplaced",
                            shape="as computed"))  # fmt: skip
            continue
        if isinstance(module, efficientformer_v2.Attention2d):  # talking heads: the softmax
            taps.append(Tap(f"{name}.hook_pattern", f"{name}.talking_head2", site="input",
                            kind="unplaced", shape="B H N N"))  # fmt: skip
            continue
        if isinstance(module, _NO_MAP) or not any(
            hasattr(module, p) for p in ("qkv", "q", "kv", "qk", "q_proj", "query")
        ):
            continue
        site = next(
            (child for child, kind in (("attn_drop", nn.Dropout), ("softmax", nn.Softmax))
             if isinstance(getattr(module, child, None), kind)),
            None,
        )  # fmt: skip
        if site is not None:
            taps.append(
                Tap(f"{name}.hook_pattern", f"{name}.{site}", kind="unplaced",
                    unfuse=name if hasattr(module, "fused_attn") else None,
                    shape="as captured")
            )  # fmt: skip
    return taps


# maps of families without an adapter that no module hands on: recomputed from the input
_RECOMPUTED_UNPLACED = {
    tiny_vit.Attention: biased_attention_pattern,
    efficientformer.Attention: biased_attention_pattern,
    hieradet_sam2.MultiScaleAttention: pooled_query_pattern,
    lowformer.ConvAttention: conv_attention_pattern,
    cpubone.ConvAttention: conv_attention_pattern,
    shvit.SHSA: single_head_pattern,
    BottleneckAttn: bottleneck_pattern,
    efficientvit_msra.CascadedGroupAttention: cascaded_group_pattern,
}

# attention modules with an ``attn_drop`` they never call and no N x N map to read: CoaT's
# factorized attention (Xu et al., "Co-Scale Conv-Attentional Image Transformers", its
# factorized attention mechanism) multiplies Q into softmax(K)^T V, a C x C matrix per head, so no
# map over token pairs exists
_NO_MAP = (coat.FactorAttnConvRelPosEnc,)

# attention modules read outside blocks: pooling heads (ViT, EVA, NaFlexViT strip or keep the
# prefix tokens), CrossViT's fusion of the branches, LeViT's downsampling attention
_OUTSIDE_BLOCKS = (AttentionPoolLatent, crossvit.CrossAttention, levit.AttentionDownsample)
