"""Small CPU variants (32 px, patch 4) of what the CaiT paper compares, built from timm's
`VisionTransformer` and `Cait`: residual-branch strategies (Fig. 1 / Table 1), the class token
inserted at a later layer (Fig. 2 / Table 2), the class-attention stage with 1 or 2 layers, and
talking heads on or off.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import Attention
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.cait import Cait
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from ...datasets.shapes import SHAPES_MEAN, SHAPES_STD
from ...families import BlockSite, Family, FamilyLayout, register_family
from ...families.timm import vit
from .residual_block import ResidualBlock, TalkingHeads, fixup_init
from .residual_scale import RESIDUAL_STRATEGIES

__all__ = ["LateClassTokenViT", "residual_vit"]

TINY = {"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 12, "num_heads": 4,
        "mlp_ratio": 2.0, "num_classes": 10}  # fmt: skip


_NAMES = [f"vizkit_vit_tiny_{s}" for s in RESIDUAL_STRATEGIES] + [
    "vizkit_vit_tiny_late_cls",
    "vizkit_cait_tiny_ca2",
    "vizkit_cait_tiny_ca1",
    "vizkit_cait_tiny_plain_heads",
]
# read by timm's register_model: the data these variants are made for (Shapes, 32 px)
default_cfgs = generate_default_cfgs(
    {
        name: {
            "input_size": (3, 32, 32),
            "num_classes": 10,
            "mean": SHAPES_MEAN,
            "std": SHAPES_STD,
            "crop_pct": 1.0,
            "first_conv": "patch_embed.proj",
        }  # fmt: skip
        for name in _NAMES
    }
)


class LateClassTokenViT(VisionTransformer):
    """A ViT whose class token joins the patches before block ``cls_insert_layer`` (0: ViT;
    CaiT's Table 2 inserts it late). Blocks before it see the patches only; positional
    embeddings are the patches' alone."""

    def __init__(self, cls_insert_layer: int = 0, **kwargs) -> None:
        super().__init__(class_token=True, no_embed_class=True, **kwargs)
        if not 0 <= cls_insert_layer < len(self.blocks):
            raise ValueError(
                f"cls_insert_layer must be in 0..{len(self.blocks) - 1} (before one of the "
                f"{len(self.blocks)} blocks); got {cls_insert_layer}."
            )
        self.cls_insert_layer = cls_insert_layer

    def forward_features(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("LateClassTokenViT takes no attention mask and is not causal.")
        x = self.patch_embed(x)  # (B, Np, C)
        x = self.norm_pre(self.pos_drop(x + self.pos_embed))
        for i, block in enumerate(self.blocks):
            if i == self.cls_insert_layer:
                x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
            x = block(x)
        return self.norm(x)


def _late_class_layout(model: LateClassTokenViT) -> FamilyLayout:
    """Blocks before ``cls_insert_layer`` hold the patches only; the rest [class, patches]."""
    layout = vit.layout(model)
    layout.family = "late_class_token_vit"
    layout.blocks = [
        BlockSite(site.path, tokens="Np", prefix_tokens=0) if i < model.cls_insert_layer else site
        for i, site in enumerate(layout.blocks)
    ]
    return layout


register_family(
    Family("late_class_token_vit", "vizkit", models={LateClassTokenViT: _late_class_layout})
)


def residual_vit(
    residual: str = "layerscale",
    eps: float = 0.1,
    talking: bool = False,
    cls_insert_layer: int = 0,
    **kwargs,
) -> LateClassTokenViT:
    """A tiny ViT (`TINY`, overridable) with `ResidualBlock` blocks of ``residual`` strategy,
    LayerScale ``eps`` (0.1 up to depth 18, the paper's rule), optional talking heads, and the
    class token inserted before block ``cls_insert_layer``."""
    config = {**TINY, **kwargs}
    block = partial(ResidualBlock, residual=residual, eps=eps)
    attention = TalkingHeads if talking else Attention
    model = LateClassTokenViT(
        cls_insert_layer, block_fn=block, attn_layer=attention, qkv_bias=True, **config
    )
    if residual == "fixup":  # after timm's weight init, which would overwrite it
        for blk in model.blocks:
            fixup_init(blk, len(model.blocks))
    return model


def _build(variant: str, pretrained: bool, builder, **kwargs):
    """timm's model construction (pretrained_cfg and its overlay, e.g. a zoo card's mean/std)."""
    return build_model_with_cfg(builder, variant, pretrained, **kwargs)


def _residual(name: str, strategy: str, pretrained: bool, /, **kwargs) -> LateClassTokenViT:
    """The registered tiny deep ViT ``name`` with residual branches of ``strategy``."""
    return _build(name, pretrained, partial(residual_vit, strategy), **kwargs)


@register_model
def vizkit_vit_tiny_prenorm(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny deep ViT (depth 12, 32 px), residual branches: prenorm."""
    return _residual("vizkit_vit_tiny_prenorm", "prenorm", pretrained, **kwargs)


@register_model
def vizkit_vit_tiny_rezero(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny deep ViT (depth 12, 32 px), residual branches: rezero."""
    return _residual("vizkit_vit_tiny_rezero", "rezero", pretrained, **kwargs)


@register_model
def vizkit_vit_tiny_skipinit(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny deep ViT (depth 12, 32 px), residual branches: skipinit."""
    return _residual("vizkit_vit_tiny_skipinit", "skipinit", pretrained, **kwargs)


@register_model
def vizkit_vit_tiny_fixup(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny deep ViT (depth 12, 32 px), residual branches: fixup."""
    return _residual("vizkit_vit_tiny_fixup", "fixup", pretrained, **kwargs)


@register_model
def vizkit_vit_tiny_layerscale(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny deep ViT (depth 12, 32 px), residual branches: layerscale."""
    return _residual("vizkit_vit_tiny_layerscale", "layerscale", pretrained, **kwargs)


@register_model
def vizkit_vit_tiny_layerscale_zero(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny deep ViT (depth 12, 32 px), residual branches: layerscale_zero."""
    return _residual("vizkit_vit_tiny_layerscale_zero", "layerscale_zero", pretrained, **kwargs)


@register_model
def vizkit_vit_tiny_late_cls(pretrained: bool = False, **kwargs) -> LateClassTokenViT:
    """Tiny ViT with the class token inserted 2 blocks before the end (Table 2's best k)."""
    depth = kwargs.get("depth", TINY["depth"])
    kwargs = {"cls_insert_layer": depth - 2, **kwargs}
    return _build("vizkit_vit_tiny_late_cls", pretrained, residual_vit, **kwargs)


def _cait(variant: str, pretrained: bool, depth_token_only: int, talking: bool, **kwargs) -> Cait:
    config = {**TINY, "init_values": 0.1, **kwargs}
    return _build(
        variant, pretrained, Cait, depth_token_only=depth_token_only,
        attn_block=TalkingHeads if talking else Attention, **config,
    )  # fmt: skip


@register_model
def vizkit_cait_tiny_ca2(pretrained: bool = False, **kwargs) -> Cait:
    """Tiny CaiT: 12 self-attention blocks with talking heads, 2 class-attention blocks."""
    return _cait("vizkit_cait_tiny_ca2", pretrained, 2, True, **kwargs)


@register_model
def vizkit_cait_tiny_ca1(pretrained: bool = False, **kwargs) -> Cait:
    """Tiny CaiT with a single class-attention block."""
    return _cait("vizkit_cait_tiny_ca1", pretrained, 1, True, **kwargs)


@register_model
def vizkit_cait_tiny_plain_heads(pretrained: bool = False, **kwargs) -> Cait:
    """Tiny CaiT without talking heads (plain multi-head attention in the SA stage)."""
    return _cait("vizkit_cait_tiny_plain_heads", pretrained, 2, False, **kwargs)
