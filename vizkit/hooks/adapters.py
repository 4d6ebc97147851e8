"""Per-architecture adapters: the canonical hook names of a model and the module site of each.

Every model gets ``<path>.hook_out`` for each submodule's output (so CNNs work for Grad-CAM and
CKA) and each vizkit `HookPoint` under its own path. timm ViT-family models and CaiT additionally
get the residual-stream and attention names of DESIGN.md; those replace the ``hook_out`` of the
module they are read from, so every activation has exactly one name.

Shapes (axis letters: B batch, H heads, N tokens incl. prefix, Np patches, C channels):

=================================  =====================================  ================
name                               read from (timm 1.0)                   shape
=================================  =====================================  ================
hook_embed                         ``patch_embed`` output (NHWC flattened) (B, Np, C)
blocks.{i}.hook_resid_pre          ``blocks.{i}`` input                    (B, N, C)
blocks.{i}.attn.hook_pattern       ``attn.attn_drop`` output, fused off    (B, H, N, N)
blocks.{i}.hook_attn_out           ``drop_path1`` output (after ``ls1``)   (B, N, C)
blocks.{i}.hook_resid_mid          ``norm2`` input                         (B, N, C)
blocks.{i}.hook_mlp_out            ``drop_path2`` output (after ``ls2``)   (B, N, C)
blocks.{i}.hook_resid_post         ``blocks.{i}`` output                   (B, N, C)
hook_final_norm                    ``norm`` output                         (B, N, C)
=================================  =====================================  ================

CaiT: ``blocks.{i}`` (self-attention stage) hold patch tokens only (N = Np, no prefix);
``blocks.{i}.attn.hook_pattern`` is the post-softmax map S (row-stochastic, read at the input of
``proj_w``) and ``blocks.{i}.attn.hook_pattern_mixed`` the talking-heads map after ``proj_w``
(not row-stochastic). The class-attention stage ``blocks_token_only.{j}`` carries the class
token: resid names are (B, 1, C) and ``attn.hook_pattern`` is (B, H, 1, 1 + Np), the class token's
attention over itself and every patch. CaiT's branches multiply by ``gamma_1``/``gamma_2``
(parameters, not modules) and share one ``drop_path`` module, so ``hook_attn_out`` and
``hook_mlp_out`` are its first and second call.
"""

from __future__ import annotations

from timm.layers import Attention
from timm.models.cait import Cait, ClassAttn, TalkingHeadAttn
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from .hook_point import HookPoint
from .taps import Tap, heads_last_to_first, nhwc_to_nlc

__all__ = ["build_taps"]

_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def build_taps(model: nn.Module) -> list[Tap]:
    """All taps of ``model`` in module order (inputs before, outputs after a module's children)."""
    special = _architecture_taps(model)
    inputs: dict[str, list[Tap]] = {}
    outputs: dict[str, list[Tap]] = {}
    for tap in special:
        (inputs if tap.site == "input" else outputs).setdefault(tap.module, []).append(tap)

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
            taps.append(Tap(name=f"{path}.hook_out", module=path))

    visit("", model)
    return taps


def _architecture_taps(model: nn.Module) -> list[Tap]:
    if isinstance(model, VisionTransformer):
        return _vit_taps(model)
    if isinstance(model, Cait):
        return _cait_taps(model)
    return []


def _residual_taps(
    block: str,
    attn_out: str,
    mlp_out: str,
    *,
    x_arg: int = 0,
    shape: str = "B N C",
    prefix_tokens: int | None = None,
) -> list[Tap]:
    """resid_pre/mid/post of a pre-norm block and its two branch outputs, read from the modules
    ``attn_out`` and ``mlp_out``; if both are one shared module, from its first and second call."""
    common = {"shape": shape, "prefix_tokens": prefix_tokens}
    shared = attn_out == mlp_out
    scope = {"call_scope": block} if shared else {}
    return [
        Tap(f"{block}.hook_resid_pre", block, site="input", arg=x_arg, **common),
        Tap(f"{block}.hook_attn_out", attn_out, call=0 if shared else None, **scope, **common),
        Tap(f"{block}.hook_resid_mid", f"{block}.norm2", site="input", **common),
        Tap(f"{block}.hook_mlp_out", mlp_out, call=1 if shared else None, **scope, **common),
        Tap(f"{block}.hook_resid_post", block, **common),
    ]


def _unfused_pattern(attn: str, shape: str, prefix_tokens: int | None = None) -> Tap:
    """The post-softmax map at ``attn_drop``'s output, which runs only with fused attention off."""
    return Tap(
        f"{attn}.hook_pattern", f"{attn}.attn_drop", unfuse=attn, shape=shape,
        prefix_tokens=prefix_tokens,
    )  # fmt: skip


def _talking_heads_patterns(attn: str, shape: str, prefix_tokens: int | None) -> list[Tap]:
    """Talking heads: the softmax map S at ``proj_w``'s input, the mixed map after it."""
    return [
        Tap(f"{attn}.hook_pattern", f"{attn}.proj_w", site="input", shape=shape,
            prefix_tokens=prefix_tokens, **heads_last_to_first),
        Tap(f"{attn}.hook_pattern_mixed", f"{attn}.attn_drop", shape=shape,
            prefix_tokens=prefix_tokens),
    ]  # fmt: skip


def _vit_taps(model: VisionTransformer) -> list[Tap]:
    taps = [Tap("hook_embed", "patch_embed", shape="B Np C", **nhwc_to_nlc)]
    late = getattr(model, "cls_insert_layer", 0)  # vizkit's LateClassTokenViT
    for i, blk in enumerate(model.blocks):
        p = f"blocks.{i}"
        prefix, n = (0, "Np") if i < late else (None, "N")  # before the class token joins
        if isinstance(blk, Block):
            taps += _residual_taps(
                p, f"{p}.drop_path1", f"{p}.drop_path2", shape=f"B {n} C", prefix_tokens=prefix
            )
        else:  # other block layouts (ResPostBlock, parallel blocks): only the stream ends
            taps += [
                Tap(f"{p}.hook_resid_pre", p, site="input", shape="B N C"),
                Tap(f"{p}.hook_resid_post", p, shape="B N C"),
            ]
        attn = getattr(blk, "attn", None)
        if isinstance(attn, Attention):
            taps.append(_unfused_pattern(f"{p}.attn", f"B H {n} {n}", prefix))
        elif isinstance(attn, TalkingHeadAttn):
            taps += _talking_heads_patterns(f"{p}.attn", f"B H {n} {n}", prefix)
    taps.append(Tap("hook_final_norm", "norm", shape="B N C"))
    return taps


def _cait_taps(model: Cait) -> list[Tap]:
    taps = [Tap("hook_embed", "patch_embed", shape="B Np C", prefix_tokens=0, **nhwc_to_nlc)]
    for i, blk in enumerate(model.blocks):
        p = f"blocks.{i}"
        taps += _residual_taps(
            p, f"{p}.drop_path", f"{p}.drop_path", shape="B Np C", prefix_tokens=0
        )
        if isinstance(blk.attn, TalkingHeadAttn):
            taps += _talking_heads_patterns(f"{p}.attn", "B H Np Np", 0)
        elif isinstance(blk.attn, Attention):  # vizkit's CaiT without talking heads
            taps.append(_unfused_pattern(f"{p}.attn", "B H Np Np", 0))
    for j, blk in enumerate(model.blocks_token_only or ()):
        p = f"blocks_token_only.{j}"
        taps += _residual_taps(
            p,
            f"{p}.drop_path",
            f"{p}.drop_path",
            x_arg=1,  # forward(x_patches, x_cls): the residual stream is the class token
            shape="B 1 C",
            prefix_tokens=1,
        )
        if isinstance(blk.attn, ClassAttn):
            taps.append(_unfused_pattern(f"{p}.attn", "B H 1 N"))
    taps.append(Tap("hook_final_norm", "norm", shape="B N C"))
    return taps
