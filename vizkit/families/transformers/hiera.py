"""Hugging Face transformers' Hiera (``HieraModel``, ``HieraBackbone``; found inside
``HieraForImageClassification`` or a module of your own).

Blocks ``encoder.stages.{s}.layers.{i}`` hold the tokens unrolled (mask units first), as timm's
(`vizkit.families.timm.hiera`), until the last stage; ``encoder.reroll`` puts a stage's tokens
back on the raster grid. Pre-norm: ``x + drop_path(attn(layernorm_before(x)))`` (the first layer
of a pooling stage adds to ``proj(layernorm_before(x))`` max-pooled instead), then
``x + drop_path(mlp(layernorm_after(x)))``, one ``drop_path`` module for both branches (its first
and second call). Each layer returns ``(stream, weights)``.

Maps: the weights ``HieraMaskUnitAttention`` returns as its second output when called with
``output_attentions=True`` (set for the call by a pre-hook), the tensor it multiplies with the
values, (B, H, nW, Nq, Nk) in unrolled order; put in image space from ``encoder.reroll`` as for
timm. The unrolling follows ``config.image_size``: the maps need the model run at that size,
with every mask unit kept (no MAE masking, as ``HieraForPreTraining`` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from ...hooks.family import (
    AttentionContext,
    BlockSite,
    Family,
    FamilyLayout,
    ResidualSpec,
    register_family,
)
from ...hooks.layout import TokenLayout
from ...hooks.readers import ExplicitPathReader, OutputReader
from ...hooks.taps import Tap
from ..grids import conv_grid
from ..timm.hiera import raster_order, unrolled_grid, unrolled_map

__all__ = ["layout", "returning_weights"]

_HIERA = "transformers.models.hiera.modeling_hiera"


def layout(model: nn.Module) -> FamilyLayout:
    """``HieraModel`` / ``HieraBackbone``: ``embeddings`` (raster, before unrolling) as
    ``hook_embed``, then ``encoder.stages.{s}.layers.{i}``."""
    schedule = model.encoder.schedule  # stage -> (strides still unrolled, grid)
    blocks = []
    for s, stage in enumerate(model.encoder.stages):
        for i in range(len(stage.layers)):
            before = s - 1 if s > 0 and i == 0 else s
            blocks.append(
                BlockSite(f"encoder.stages.{s}.layers.{i}", tokens="Np", prefix_tokens=0,
                          grid=unrolled_grid(schedule[s]),
                          input_grid=unrolled_grid(schedule[before]))
            )  # fmt: skip
    first = conv_grid(model.embeddings.patch_embeddings.projection)
    extra = [
        Tap("hook_embed", "embeddings", OutputReader(0), shape="B Np C", prefix_tokens=0,
            grid=first)
    ]  # fmt: skip

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, first(image_size), False)

    return FamilyLayout("hiera", blocks, extra, tokens=tokens, reads_class_token=False)


@contextmanager
def returning_weights(attn: nn.Module) -> Iterator[None]:
    """``attn`` is called with ``output_attentions=True`` inside the context (it returns its
    weights beside its output; the layer passes them on unused); the pre-hook is removed on
    exit, also after an error."""

    def ask(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        return args, {**kwargs, "output_attentions": True}

    handle = attn.register_forward_pre_hook(ask, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _returned(path: str, attn: nn.Module, context: AttentionContext) -> list[Tap]:
    """``hook_pattern`` in image space: the weights the module returns (read-only)."""
    encoder = context.model.encoder
    s, i = next(
        (s, i)
        for s, stage in enumerate(encoder.stages)
        for i, layer in enumerate(stage.layers)
        if layer is context.block
    )
    sizes = {stage: size for stage, (_, size) in encoder.schedule.items()}
    order = raster_order(encoder.reroll, sizes, s - 1 if s > 0 and i == 0 else s, s)
    windows = 1
    if attn.use_mask_unit_attn:
        windows = len(order.keys) // (attn.query_stride * attn.window_size)
    read = ExplicitPathReader.returned(lambda: returning_weights(attn))
    tap = unrolled_map(f"{path}.hook_pattern", path, order, windows, read)
    return [tap]


# x + drop_path(attn(layernorm_before(x))); x + drop_path(mlp(layernorm_after(x)))
_LAYER = ResidualSpec("drop_path", "drop_path", "layernorm_after", output_item=0)

FAMILY = register_family(
    Family(
        "hiera",
        "transformers",
        models={f"{_HIERA}:HieraModel": layout, f"{_HIERA}:HieraBackbone": layout},
        blocks={f"{_HIERA}:HieraLayer": _LAYER},
        attention={f"{_HIERA}:HieraMaskUnitAttention": _returned},
    )
)
