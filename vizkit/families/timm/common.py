"""What several timm families share: the residual layouts of timm's blocks, the embedding and
final-norm taps, and the relative position biases of BEiT, relpos ViT, Swin and MaxViT."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ...hooks.family import AttentionContext, BlockSite, FamilyLayout, ResidualSpec
from ...hooks.taps import Tap, nhwc_to_nlc

__all__ = [
    "POST_NORM",
    "PRE_NORM",
    "SHARED_DROP_PATH",
    "embed_tap",
    "flat_layout",
    "final_norm_taps",
    "has_position_bias",
    "position_bias",
]

# x + drop_path1(.. attn(norm1(x))); x + drop_path2(.. mlp(norm2(x)))
PRE_NORM = ResidualSpec()
# x + drop_path1(norm1(attn(x))); x + drop_path2(norm2(mlp(x)))
POST_NORM = ResidualSpec(mid="mlp")
# CaiT, ConViT: one drop_path for both branches (its first and second call)
SHARED_DROP_PATH = ResidualSpec("drop_path", "drop_path", "norm2")


def embed_tap(path: str = "patch_embed", **layout) -> Tap:
    """The patch embedding's output: patches only, before any prefix token joins."""
    return Tap("hook_embed", path, shape="B Np C", **nhwc_to_nlc, **{"prefix_tokens": 0, **layout})


def flat_layout(family: str) -> Callable[[nn.Module], FamilyLayout]:
    """The layout of a family with one ``blocks`` list over [prefix, patches] (EVA, BEiT,
    relpos ViT), an embedding and a final norm."""

    def layout(model: nn.Module) -> FamilyLayout:
        blocks = [BlockSite(f"blocks.{i}") for i in range(len(model.blocks))]
        return FamilyLayout(family, blocks, [embed_tap(), *final_norm_taps(model)])

    return layout


def final_norm_taps(model: nn.Module, path: str = "norm", **layout) -> list[Tap]:
    """``hook_final_norm`` where the model has a final norm at ``path``."""
    if getattr(model, path, None) is None:
        return []
    return [Tap("hook_final_norm", path, shape="B N C", **layout)]


_SHARED_KWARGS = ("shared_rel_pos_bias", "shared_rel_pos")  # BEiT; relpos ViT, MaxViT
_SHARED_ATTRS = ("rel_pos_bias", "shared_rel_pos")  # the model-level modules that pass them


def has_position_bias(attn: nn.Module, context: AttentionContext) -> bool:
    """Whether ``attn`` adds a relative position bias of its own to its logits, or the model
    passes it one shared across layers."""
    if any(getattr(context.model, a, None) is not None for a in _SHARED_ATTRS):
        return True
    if getattr(attn, "rel_pos", None) is not None:  # relpos ViT, MaxViT
        return True
    if getattr(attn, "cpb_mlp", None) is not None:  # SwinV2
        return True
    return getattr(attn, "relative_position_bias_table", None) is not None  # BEiT, Swin


def position_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, Nq, Nk): the relative position bias ``attn`` adds to its logits in this call (its own
    table plus a bias shared across layers where one is passed in). For window attention Nq = Nk
    = w², the same for every window.

    Swin V2 (Liu et al. 2022, Sec. 3.3): 16 sigmoid(MLP(log-spaced relative coordinates)),
    recomputed from ``cpb_mlp`` as the module does.
    """
    shared = next((kwargs[k] for k in _SHARED_KWARGS if kwargs.get(k) is not None), None)
    if shared is None and len(args) > 1 and isinstance(args[1], Tensor):
        shared = args[1]
    if getattr(attn, "rel_pos", None) is not None:
        bias = attn.rel_pos.get_bias()
    elif getattr(attn, "cpb_mlp", None) is not None:
        bias = _swinv2_bias(attn)
    elif getattr(attn, "relative_position_bias_table", None) is not None:
        bias = attn._get_rel_pos_bias()
    else:
        bias = None
    if shared is not None:
        bias = shared if bias is None else bias + shared
    if bias is None:
        raise RuntimeError(f"{type(attn).__name__} ran without a position bias to read.")
    return bias.reshape(bias.shape[-3:])


def _swinv2_bias(attn: nn.Module) -> Tensor:
    table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
    area = attn.window_size[0] * attn.window_size[1]
    bias = table[attn.relative_position_index.view(-1)].view(area, area, -1)
    return 16 * torch.sigmoid(bias.permute(2, 0, 1))
