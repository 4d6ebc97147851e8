"""The canonical hook names of a model and the module site of each.

Every model gets ``<path>.hook_out`` for each submodule's output (so CNNs work for Grad-CAM and
CKA) and each vizkit `HookPoint` under its own path. Models whose family is registered
(`vizkit.hooks.family`, one module per family under `vizkit.families`) additionally get the
residual-stream and attention names of each block; those replace the ``hook_out`` of the module
they are read from, so every activation has exactly one name.

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
attention module with timm's ``attn_drop`` site (or a site its family registered for this case),
as captured (kind "unplaced").

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

from torch import nn

from .family import (
    AttentionContext,
    FamilyLayout,
    attention_site,
    family_layout,
    unplaced_site,
)
from .hook_point import HookPoint
from .sites import block_taps, unfused_child
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
    layout = layout or family_layout(model)
    special = _architecture_taps(model, layout)
    run_order = {} if layout is None else _forward_children(model, layout)
    inputs: dict[str, list[Tap]] = {}
    outputs: dict[str, list[Tap]] = {}
    derived: dict[str, list[Tap]] = {}  # values computed beside a module's output
    for tap in special:
        site = derived if not tap.read.on_path else inputs if tap.read.reads_input else outputs
        site.setdefault(tap.module, []).append(tap)

    taps: list[Tap] = []
    seen: set[int] = set()

    def visit(path: str, module: nn.Module) -> None:
        if id(module) in seen:
            return
        seen.add(id(module))
        taps.extend(inputs.get(path, ()))
        for child_name, child in run_order.get(path) or module.named_children():
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


def _forward_children(model: nn.Module, layout: FamilyLayout) -> dict[str, list]:
    """Block path -> its (name, child) pairs in forward order, for the blocks whose family says
    the forward runs them in another order than they were registered."""
    order = {}
    for site in layout.blocks:
        if site.forward_children:
            block = model.get_submodule(site.path)
            ran = [(name, block.get_submodule(name)) for name in site.forward_children]
            rest = [(n, c) for n, c in block.named_children() if n not in site.forward_children]
            order[site.path] = ran + rest
    return order


def _architecture_taps(model: nn.Module, layout: FamilyLayout | None) -> list[Tap]:
    """Residual and attention taps of every block of a registered family, and the maps of
    attention modules its family reads outside blocks (pooling heads, CrossViT's fusion) within
    the module the layout describes (not, e.g., a CLIP model's text tower)."""
    if layout is None:
        return _unplaced_patterns(model)
    taps: list[Tap] = list(layout.extra)
    inside: set[str] = set()
    root = model.get_submodule(layout.root) if layout.root else model  # what the family reads
    for site in layout.blocks:
        block = model.get_submodule(site.path)
        taps += block_taps(site, block)
        class_stream = site.tokens == "1"  # its maps read [class, patches], not the stream
        context = AttentionContext(
            root, block, tokens=site.tokens,
            prefix_tokens=None if class_stream else site.prefix_tokens,
            grid=None if class_stream else site.grid,
        )  # fmt: skip
        for name, module in block.named_modules(prefix=site.path):
            inside.add(name)
            read = attention_site(module)
            taps += read(name, module, context) if read is not None else []
    last = layout.blocks[-1] if layout.blocks else None  # the tokens the head reads
    head = layout.head_prefix_tokens
    outside = AttentionContext(
        root, prefix_tokens=head if last is None or head == 0 else last.prefix_tokens,
        grid=last.grid if last is not None else None,
    )  # fmt: skip
    for name, module in root.named_modules(prefix=layout.root):
        read = attention_site(module, outside=True) if name and name not in inside else None
        taps += read(name, module, outside) if read is not None else []
    return taps


def _unplaced_patterns(model: nn.Module) -> list[Tap]:
    """For families without a layout: every attention module its family registered an
    unplaced site for, and every other attention module (one with q/k/v projections) with
    timm's ``attn_drop`` site or an ``nn.Softmax`` child, gets ``<path>.hook_pattern`` as
    captured (kind "unplaced": the token layout is unknown, so analyses that need it refuse)."""
    taps = []
    context = AttentionContext(model)
    for name, module in model.named_modules():
        read = unplaced_site(module)
        if read is not None:
            taps += read(name, module, context)
            continue
        if not any(hasattr(module, p) for p in ("qkv", "q", "kv", "qk", "q_proj", "query")):
            continue
        site = next(
            (child for child, kind in (("attn_drop", nn.Dropout), ("softmax", nn.Softmax))
             if isinstance(getattr(module, child, None), kind)),
            None,
        )  # fmt: skip
        if site is not None:
            taps.append(
                Tap(f"{name}.hook_pattern", f"{name}.{site}", unfused_child(module),
                    kind="unplaced", shape="as captured")
            )  # fmt: skip
    return taps
