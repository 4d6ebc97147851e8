"""CaiT (Touvron et al. 2021, "Going deeper with Image Transformers"): a self-attention stage over
the patches with talking-heads attention (Sec. 2: the softmax map S is read at ``proj_w``'s input,
the mixed map after it), then a class-attention stage whose stream is the class token alone."""

from __future__ import annotations

import dataclasses

from timm.models import cait
from torch import nn

from ...hooks.family import AttentionContext, BlockSite, Family, FamilyLayout, register_family
from ...hooks.readers import InputReader
from ...hooks.sites import captured
from ...hooks.taps import Tap, heads_last_to_first
from .common import SHARED_DROP_PATH, embed_tap, final_norm_taps

# LayerScale as parameters gamma_1, gamma_2 (CaiT Eq. 1), one drop_path for both branches
_BLOCK = dataclasses.replace(SHARED_DROP_PATH, scales=("gamma_1", "gamma_2"))

__all__ = ["layout"]


def layout(model: cait.Cait) -> FamilyLayout:
    blocks = [
        BlockSite(f"blocks.{i}", tokens="Np", prefix_tokens=0) for i in range(len(model.blocks))
    ]
    blocks += [  # forward(x_patches, x_cls): the stream is the class token
        BlockSite(f"blocks_token_only.{j}", x_arg=1, tokens="1", prefix_tokens=1)
        for j in range(len(model.blocks_token_only or ()))
    ]
    return FamilyLayout("cait", blocks, [embed_tap(), *final_norm_taps(model)])


def _talking_heads(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """The softmax map S at ``proj_w``'s input (heads last there) and the mixed map after it."""
    shape, common = f"B H {context.tokens} {context.tokens}", {
        "prefix_tokens": context.prefix_tokens, "grid": context.grid,
    }  # fmt: skip
    return [
        Tap(f"{path}.hook_pattern", f"{path}.proj_w", InputReader(), shape=shape, kind="self",
            **common, **heads_last_to_first),
        Tap(f"{path}.hook_pattern_mixed", f"{path}.attn_drop", shape=shape, **common),
    ]  # fmt: skip


FAMILY = register_family(
    Family(
        "cait",
        "timm",
        models={cait.Cait: layout},
        blocks={cait.LayerScaleBlock: _BLOCK, cait.LayerScaleBlockClassAttn: _BLOCK},
        attention={cait.TalkingHeadAttn: _talking_heads, cait.ClassAttn: captured("class")},
    )
)
