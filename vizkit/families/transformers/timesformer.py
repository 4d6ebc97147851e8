"""Hugging Face transformers' TimeSformer (Bertasius, Wang and Torresani, ICML 2021, "Is
Space-Time Attention All You Need for Video Understanding?"): clips (B, T, C, H, W), each frame
cut into gh x gw patches by one Conv2d (Sec. 3, "decomposition into patches"), a class token,
then pre-norm blocks ``encoder.layer.{i}``. ``TimesformerForVideoClassification`` reads the class
token.

Divided space-time attention (the default, Sec. 3): each block runs ``temporal_attention``
(each patch over itself in every frame, (B·gh·gw, H, T, T), then ``temporal_dense``), then
``attention`` (each frame's [class, patches], (B·T, H, 1 + gh·gw, 1 + gh·gw)); its hook names
follow that order. Both maps are read at their ``attention.attn_drop`` output (kinds "temporal"
and "spatial", put on the clip's tokens by `vizkit.hooks.divided`). Joint space-time attention
is one (B, H, N, N) map. The stream holds the patches space-major (patch p's frames side by
side); its names hold them frame-major, [class, T x gh x gw], as every video layout.

What each branch adds to the stream is named, (B, N, C) on the clip's tokens like the stream, so
that ``hook_resid_pre`` plus the branches is ``hook_resid_post``. Divided: ``hook_temporal_out``
(``temporal_dense``'s output; zero on the class token, which takes no part in that step),
``hook_spatial_out`` (the spatial step's output after ``drop_path``, its class token averaged
over the frames as the block averages it), ``hook_mlp_out``; joint: ``hook_attn_out`` and
``hook_mlp_out``. Each block runs one ``drop_path`` after every branch (its calls, in order),
and ``hook_resid_mid`` is ``layernorm_after``'s input, the stream the MLP reads.
"Space only" attention runs the frames as separate images and is not covered.
"""

from __future__ import annotations

from torch import Tensor, nn

from ...hooks.divided import (
    TokensReader,
    space_major_map,
    space_major_stream,
    spatial_addition,
    spatial_addition_back,
    temporal_addition,
    temporal_addition_back,
)
from ...hooks.family import AttentionContext, BlockSite, Family, FamilyLayout, register_family
from ...hooks.layout import TokenLayout
from ...hooks.readers import InputReader, NthCall
from ...hooks.taps import Tap
from ...hooks.video import VideoInput

__all__ = ["layout"]

_TIMESFORMER = "transformers.models.timesformer.modeling_timesformer"
# the children of a block in the order its forward runs them; ``drop_path`` runs after every
# branch, and is listed where the attention's addition (a divided block's spatial step) is read
_DIVIDED_ORDER = (
    "temporal_layernorm", "temporal_attention", "temporal_dense",
    "layernorm_before", "attention", "drop_path", "layernorm_after", "intermediate", "output",
)  # fmt: skip
_JOINT_ORDER = (
    "layernorm_before", "attention", "drop_path", "layernorm_after", "intermediate", "output",
)  # fmt: skip


def layout(model: nn.Module) -> FamilyLayout | None:
    """``TimesformerModel``: embeddings, ``encoder.layer.{i}``, ``layernorm``; None for "space
    only" attention (the frames are separate images there, B·T of them)."""
    config = model.config
    if config.attention_type not in ("divided_space_time", "joint_space_time"):
        return None
    frames = config.num_frames
    order = _stream_order(frames)
    divided = config.attention_type == "divided_space_time"
    children = _DIVIDED_ORDER if divided else _JOINT_ORDER
    blocks = [BlockSite(f"encoder.layer.{i}", token_order=order, forward_children=children,
                        output_item=0)
              for i in range(len(model.encoder.layer))]  # fmt: skip
    extra = [tap for i, block in enumerate(model.encoder.layer)
             for tap in _branch_taps(f"encoder.layer.{i}", block, frames, divided)]  # fmt: skip
    extra.append(Tap("hook_final_norm", "layernorm", shape="B N C", **order))
    embed = model.embeddings.patch_embeddings
    size = tuple(embed.image_size)
    video = VideoInput(int(config.num_frames), 1, embed.projection.in_channels, size)
    ph, pw = embed.patch_size

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(1, (image_size[0] // ph, image_size[1] // pw), True,
                           frames=video.token_frames)  # fmt: skip

    return FamilyLayout("timesformer", blocks, extra, tokens=tokens, reads_class_token=True,
                        video=video)  # fmt: skip


def _stream_order(frames: int) -> dict:
    """The stream's space-major tokens [class, gh·gw x T] held frame-major."""

    def to_canonical(t: Tensor) -> Tensor:
        return space_major_stream(t, frames, prefix=1)

    def from_canonical(new: Tensor, raw: Tensor) -> Tensor:
        return space_major_stream(new, frames, prefix=1, inverse=True)

    return {"to_canonical": to_canonical, "from_canonical": from_canonical}


def _branch_taps(path: str, block: nn.Module, frames: int, divided: bool) -> list[Tap]:
    """What each branch of the block at ``path`` adds to the stream, and the stream the MLP
    reads, each (B, N, C) over the clip's tokens, frame-major. ``drop_path`` runs after every
    branch: its calls are the joint attention's and the MLP's additions (0, 1), or the divided
    temporal step's (before ``temporal_dense``, not read there), spatial step's and MLP's
    (0, 1, 2)."""
    stream = {"shape": "B N C", **_stream_order(frames)}
    drop = f"{path}.drop_path"
    mid = Tap(f"{path}.hook_resid_mid", f"{path}.layernorm_after", InputReader(), **stream)
    if not divided:
        return [
            Tap(f"{path}.hook_attn_out", drop, NthCall(0, block), **stream),
            mid,
            Tap(f"{path}.hook_mlp_out", drop, NthCall(1, block), **stream),
        ]
    temporal = Tap(f"{path}.hook_temporal_out", f"{path}.temporal_dense", shape="B N C",
                   **_temporal_order(frames))  # fmt: skip
    spatial = TokensReader(lambda raw: spatial_addition(raw, frames),
                           lambda new, raw: spatial_addition_back(new, raw, frames))  # fmt: skip
    return [
        temporal,
        Tap(f"{path}.hook_spatial_out", drop, NthCall(1, block, spatial), shape="B N C"),
        mid,
        Tap(f"{path}.hook_mlp_out", drop, NthCall(2, block), **stream),
    ]


def _temporal_order(frames: int) -> dict:
    """``temporal_dense``'s space-major patches (B, gh·gw·T, C) held as the clip's tokens,
    zero on the class token (`temporal_addition`; a gradient is that map's too, as it only
    moves the patches and adds a token nothing reads)."""

    def to_canonical(t: Tensor) -> Tensor:
        return temporal_addition(t, frames)

    def from_canonical(new: Tensor, raw: Tensor) -> Tensor:
        return temporal_addition_back(new, raw, frames)

    return {"to_canonical": to_canonical, "from_canonical": from_canonical}


def _map_order(frames: int) -> dict:
    """A joint map over space-major tokens, held over frame-major tokens."""

    def to_canonical(t: Tensor) -> Tensor:
        return space_major_map(t, frames, prefix=1)

    def from_canonical(new: Tensor, raw: Tensor) -> Tensor:
        return space_major_map(new, frames, prefix=1, inverse=True)

    return {"to_canonical": to_canonical, "from_canonical": from_canonical}


def attention_map(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` of a ``TimeSformerAttention``: the post-softmax map at its
    ``attention.attn_drop`` output (eval mode makes the dropout the identity), as the block
    multiplies it with the values."""
    config = context.model.config
    read = f"{path}.attention.attn_drop"
    if config.attention_type == "joint_space_time":
        return [Tap(f"{path}.hook_pattern", read, kind="self", shape="B H N N", prefix_tokens=1,
                    **_map_order(config.num_frames))]  # fmt: skip
    if path.endswith("temporal_attention"):
        return [Tap(f"{path}.hook_pattern", read, kind="temporal", shape="B·gh·gw H T T")]
    return [Tap(f"{path}.hook_pattern", read, kind="spatial", shape="B·T H 1+gh·gw 1+gh·gw")]


FAMILY = register_family(
    Family(
        "timesformer",
        "transformers",
        models={f"{_TIMESFORMER}:TimesformerModel": layout},
        attention={f"{_TIMESFORMER}:TimeSformerAttention": attention_map},
    )
)
