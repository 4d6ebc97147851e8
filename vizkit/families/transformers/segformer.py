"""Hugging Face transformers' SegFormer (Xie et al. 2021, "SegFormer: Simple and Efficient
Design for Semantic Segmentation with Transformers"): a hierarchical encoder (Sec. 3.1) of four
stages ``stages.{s}``, each an overlapping patch embedding (a strided, padded Conv2d), pre-norm
blocks ``stages.{s}.blocks.{i}`` over its grid's patches (no prefix tokens) and a LayerNorm;
``SegformerForSemanticSegmentation``'s all-MLP decoder (Sec. 3.2) reads every stage and returns
per-pixel class logits at a quarter of the image size, explained with `vizkit.targets`' dense
targets. Found inside it, ``SegformerForImageClassification`` or a module of your own.

Efficient self-attention (Sec. 3.1, Eq. 2): the keys and values of a stage with reduction ratio
r > 1 come from a stride-r convolution over its grid, so its maps are (B, H, Np, Np / r²) over
the reduced keys (kind "pooled": no N x N map, which rollout needs); a stage with r = 1 attends
over every patch (kind "self"). The maps are the weights the attention returns under eager
attention, the tensor it multiplies with the values. Each block adds its attention branch
through ``hidden_dropout`` and the shared ``drop_path`` module (its first call), its Mix-FFN
branch through ``drop_path`` (its second call).
"""

from __future__ import annotations

from torch import nn

from ...hooks.family import BlockSite, Family, FamilyLayout, ResidualSpec, register_family
from ...hooks.layout import TokenLayout
from ...hooks.taps import GridFn
from ..grids import conv_grid
from .common import returned_reduced_map

__all__ = ["layout", "stage_grids"]

_SEGFORMER = "transformers.models.segformer.modeling_segformer"


def stage_grids(model: nn.Module) -> list[GridFn]:
    """Image (H, W) -> stage s's grid: the patch embeddings' convolutions applied in turn."""
    convs = [stage.patch_embeddings.proj for stage in model.stages]

    def upto(s: int) -> GridFn:
        def grid(image_size: tuple[int, int]) -> tuple[int, int]:
            size = tuple(image_size)
            for conv in convs[: s + 1]:
                size = conv_grid(conv)(size)
            return size

        return grid

    return [upto(s) for s in range(len(convs))]


def layout(model: nn.Module) -> FamilyLayout:
    """``SegformerModel``: ``stages.{s}.blocks.{i}``, each stage on its own grid."""
    grids = stage_grids(model)
    blocks = [
        BlockSite(f"stages.{s}.blocks.{i}", tokens="Np", prefix_tokens=0, grid=grids[s])
        for s, stage in enumerate(model.stages)
        for i in range(len(stage.blocks))
    ]

    def tokens(image_size: tuple[int, int]) -> TokenLayout:
        return TokenLayout(0, grids[0](image_size), False)

    return FamilyLayout("segformer", blocks, [], tokens=tokens, reads_class_token=False)


# x + drop_path(hidden_dropout(attention(layernorm_before(x))));
# x + drop_path(mlp(layernorm_after(x))): one drop_path module, called once per branch
_LAYER = ResidualSpec("drop_path", "drop_path", "layernorm_after")

FAMILY = register_family(
    Family(
        "segformer",
        "transformers",
        models={f"{_SEGFORMER}:SegformerModel": layout},
        blocks={f"{_SEGFORMER}:SegformerLayer": _LAYER},
        attention={f"{_SEGFORMER}:SegformerAttention": returned_reduced_map},
    )
)
