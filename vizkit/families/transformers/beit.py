"""Hugging Face transformers' BEiT and Data2Vec-Vision (Bao et al. 2022; Baevski et al. 2022):
``BeitModel``, ``Data2VecVisionModel`` (found inside ``BeitForImageClassification``,
``Data2VecVisionForImageClassification``, the masked-image-modeling, segmentation and backbone
models, or a module of your own). Pre-norm blocks over [class, patches]:
``x + drop_path(λ1 · attention(layernorm_before(x)))``, then
``x + drop_path(λ2 · mlp(layernorm_after(x)))``, one ``drop_path`` module closing both branches
(its first and second call); LayerScale ``lambda_1`` / ``lambda_2`` where
``layer_scale_init_value > 0`` (read through ``.data``, which a block without LayerScale lacks:
BEiT then holds the float 1.0, Data2Vec None).

With ``use_mean_pooling`` (the default) the pooler averages the patch tokens and the head never
reads the class token; otherwise it reads the class token.

BEiT (transformers 5): ``BeitAttention`` calls transformers' attention interface and returns
``(output, weights)``; its map is those weights under eager attention, switched per call
(`vizkit.families.transformers.common.returned_map`). The relative position bias is computed by
the block (``relative_position_bias``, per layer) and by the model (``shared_position_bias``,
one for every layer) and handed to the attention as its additive mask; ``hook_pos_bias`` is
their sum, recomputed from the block's call (its resolution) as the block and model compute it.

Data2Vec-Vision: the self-attention class is fixed when the model is built
(``Data2VecVisionSelfAttention`` for eager, ``Data2VecVisionSdpaSelfAttention`` for sdpa), so
switching the config per call changes nothing. The eager module hands its map to its ``dropout``
child, where it is read (and may be edited); the sdpa module never makes it, so its map is
recomputed from the module's input as the eager module computes it (read-only). Its bias is its
own (``relative_position_bias``) plus the shared one the encoder passes in.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from ...hooks.family import (
    AttentionContext,
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    register_family,
)
from ...hooks.readers import ComputedReader, OutputReader
from ...hooks.sites import captured, recomputed
from ...hooks.taps import Tap
from .common import attention_config, embedding_tokens, returned_map

__all__ = ["layout"]

_BEIT = "transformers.models.beit.modeling_beit"
_D2V = "transformers.models.data2vec.modeling_data2vec_vision"


def layout(model: nn.Module) -> FamilyLayout:
    """``BeitModel`` (``layers.{i}``) / ``Data2VecVisionModel`` (``encoder.layer.{i}``):
    ``embeddings.patch_embeddings`` as ``hook_embed``, ``layernorm`` as ``hook_final_norm``
    where it is one (an ``nn.Identity`` with mean pooling)."""
    beit = hasattr(model, "layers")
    path = "layers" if beit else "encoder.layer"
    blocks = [BlockSite(f"{path}.{i}") for i in range(len(model.get_submodule(path)))]
    extra = [
        Tap("hook_embed", "embeddings.patch_embeddings", OutputReader(None if beit else 0),
            shape="B Np C", prefix_tokens=0)
    ]  # fmt: skip
    if isinstance(model.layernorm, nn.LayerNorm):
        extra.append(Tap("hook_final_norm", "layernorm", shape="B N C"))
    pooler = getattr(model, "pooler", None)
    reads_class = pooler is not None and getattr(pooler, "layernorm", None) is None
    return FamilyLayout(
        "beit", blocks, extra, tokens=embedding_tokens(model.embeddings),
        reads_class_token=reads_class,
    )  # fmt: skip


def _bound(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict:
    return {**dict(zip(names, args, strict=False)), **kwargs}


def _window(resolution, patch_size) -> tuple[int, int]:
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    return int(resolution[0]) // ph, int(resolution[1]) // pw


# -- BEiT ---------------------------------------------------------------------------------------

_BEIT_LAYER_ARGS = ("hidden_states", "attention_mask", "interpolate_pos_encoding", "resolution")


def _shared_bias_owner(model: nn.Module, block: nn.Module) -> nn.Module | None:
    """The ``BeitModel`` holding ``block``, where it has a shared position bias."""
    for module in model.modules():
        if getattr(module, "shared_position_bias", None) is None:
            continue
        if any(layer is block for layer in getattr(module, "layers", ())):
            return module
    return None


def _beit_site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``BeitAttention``: the map it returns under eager attention, and the position bias its
    block hands it (``hook_pos_bias``, (H, N, N), read when the block runs)."""
    taps = returned_map(path, attn, context)
    block = context.block
    if block is None:
        return taps
    own = getattr(block, "relative_position_bias", None)
    owner = _shared_bias_owner(context.model, block)
    shared = None if owner is None else owner.shared_position_bias
    if own is None and shared is None:
        return taps

    def bias(layer: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
        """As ``BeitLayer.forward`` and ``BeitModel.forward`` compute them (each module run by
        its ``forward``, so its own hooks do not fire a second time)."""
        call = _bound(_BEIT_LAYER_ARGS, args, kwargs)
        window = _window(call["resolution"], layer.patch_size)
        interpolate = bool(call.get("interpolate_pos_encoding", False))
        tokens = call["hidden_states"].shape[1]
        parts = [
            m.forward(window, interpolate, dim_size=tokens) for m in (own, shared) if m is not None
        ]
        total = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        return total.reshape(total.shape[-3:])

    block_path = path.rsplit(".", 1)[0]
    taps.append(
        Tap(
            f"{path}.hook_pos_bias",
            block_path,
            ComputedReader(bias),
            kind="position",
            shape="H Nq Nk",
        )
    )
    return taps


# -- Data2Vec-Vision ----------------------------------------------------------------------------

_D2V_ATTENTION_ARGS = (
    "hidden_states", "output_attentions", "relative_position_bias", "interpolate_pos_encoding",
    "resolution",
)  # fmt: skip


def _d2v_has_bias(attn: nn.Module, context: AttentionContext | None = None) -> bool:
    return bool(
        attn.has_relative_position_bias or attention_config(attn).use_shared_relative_position_bias
    )


def _d2v_biases(attn: nn.Module, args: tuple, kwargs: dict) -> list[Tensor]:
    """The module's own bias and the shared one it was given, those it has, in the order its
    forward adds them, each (1, H, N, N)."""
    call = _bound(_D2V_ATTENTION_ARGS, args, kwargs)
    biases = []
    if attn.has_relative_position_bias:
        window = _window(call["resolution"], attention_config(attn).patch_size)
        interpolate = bool(call.get("interpolate_pos_encoding", False))
        tokens = call["hidden_states"].shape[1]
        biases.append(attn.relative_position_bias.forward(window, interpolate, dim_size=tokens))
    if call.get("relative_position_bias") is not None:
        biases.append(call["relative_position_bias"])
    return biases


def _d2v_bias(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(H, N, N): what the module adds to its logits in this call."""
    biases = _d2v_biases(attn, args, kwargs)
    if not biases:
        raise RuntimeError(f"{type(attn).__name__} ran without a position bias to read.")
    total = biases[0] if len(biases) == 1 else biases[0] + biases[1]
    return total.reshape(total.shape[-3:])


def _d2v_map(attn: nn.Module, args: tuple, kwargs: dict, output: Any) -> Tensor:
    """(B, H, N, N): softmax(q kᵀ / sqrt(d) + biases), as
    ``Data2VecVisionSelfAttention.forward`` computes it (the projections run by their
    ``forward``, so their own hooks do not fire a second time)."""
    hidden = _bound(_D2V_ATTENTION_ARGS, args, kwargs)["hidden_states"]
    shape = (*hidden.shape[:-1], -1, attn.attention_head_size)
    query = attn.query.forward(hidden).view(shape).transpose(1, 2)
    key = attn.key.forward(hidden).view(shape).transpose(1, 2)
    scores = query @ key.transpose(-1, -2) / math.sqrt(attn.attention_head_size)
    for bias in _d2v_biases(attn, args, kwargs):
        scores = scores + bias
    return nn.functional.softmax(scores, dim=-1)


_D2V_EAGER = captured("self", child="dropout", position=_d2v_bias, has_position=_d2v_has_bias)


def _d2v_sdpa_site(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    position = _d2v_bias if _d2v_has_bias(attn) else None
    return recomputed("self", _d2v_map, position=position)(path, attn, context)


# x + drop_path(λ1 attention(layernorm_before(x))); x + drop_path(λ2 mlp(layernorm_after(x)))
_BEIT_LAYER = ResidualSpec(
    "drop_path", "drop_path", "layernorm_after", scales=("lambda_1.data", "lambda_2.data")
)
_D2V_LAYER = ResidualSpec(
    "drop_path", "drop_path", "layernorm_after", scales=("lambda_1.data", "lambda_2.data"),
    output_item=0,
)  # fmt: skip

FAMILY = register_family(
    Family(
        "beit",
        "transformers",
        models={f"{_BEIT}:BeitModel": layout, f"{_D2V}:Data2VecVisionModel": layout},
        blocks={f"{_BEIT}:BeitLayer": _BEIT_LAYER, f"{_D2V}:Data2VecVisionLayer": _D2V_LAYER},
        attention={
            f"{_BEIT}:BeitAttention": _beit_site,
            f"{_D2V}:Data2VecVisionSelfAttention": _D2V_EAGER,
            f"{_D2V}:Data2VecVisionSdpaSelfAttention": _d2v_sdpa_site,
        },
    )
)
