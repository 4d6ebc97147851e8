"""Refined-ViT (Refiner paper): timm's `VisionTransformer` with `RefinerAttention` in its
blocks. Tiny CPU variants (32 px, patch 4, Shapes) and the paper's configurations of Table 10.

The paper's S/M/L (Table 10, App. A.3, B.4) follow the authors' released code: official-mode
refiner, a convolutional stem, MLP ratio 3, and attention sharing: every second block reuses the
previous block's softmax map and refines it; the blocks that compute maps do not refine them.
Without sharing S would have 27.39M parameters instead of Table 10's 25M.
"""

from __future__ import annotations

from functools import partial

from timm.layers import PatchEmbed
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from ...datasets.shapes import SHAPES_MEAN, SHAPES_STD
from ...models.counting import param_count
from .refiner_attention import AttentionRelay, RefinerAttention, clear_relays

__all__ = ["ConvStemPatchEmbed", "RefinedViT", "TINY_REFINED", "refined_vit_params"]

TINY_REFINED = {"img_size": 32, "patch_size": 4, "embed_dim": 96, "depth": 6, "num_heads": 4,
                "mlp_ratio": 2.0, "num_classes": 10}  # fmt: skip
# Table 10: (blocks, hidden dim, heads, #params as printed)
PAPER_TABLE10 = {
    "vizkit_refined_vit_base": (12, 768, 12, 86e6),
    "vizkit_refined_vit_s": (16, 384, 12, 25e6),
    "vizkit_refined_vit_m": (32, 420, 12, 55e6),
    "vizkit_refined_vit_l": (32, 512, 16, 81e6),
}


class ConvStemPatchEmbed(PatchEmbed):
    """The released Refined-ViT's patch embedding (T2T-style): 7x7 stride-2 conv (3 -> 32),
    3x3 (32 -> 64), 3x3 (64 -> 128), each with BatchNorm + ReLU, then a (p/2) x (p/2) stride-p/2
    projection: (B, 3, H, W) -> (B, Np, C) with the grid of patch size p."""

    def __init__(self, img_size=224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 **kwargs) -> None:  # fmt: skip
        super().__init__(img_size, patch_size, in_chans, embed_dim, **kwargs)
        if patch_size % 2:
            raise ValueError(
                f"The conv stem halves the image first: patch_size must be even; got {patch_size}."
            )
        layers: list[nn.Module] = []
        for i, (cin, cout) in enumerate([(in_chans, 32), (32, 64), (64, 128)]):
            k, s = (7, 2) if i == 0 else (3, 1)
            conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
            layers += [conv, nn.BatchNorm2d(cout), nn.ReLU(True)]
        half = patch_size // 2
        self.proj = nn.Sequential(*layers, nn.Conv2d(128, embed_dim, half, half))


class RefinedViT(VisionTransformer):
    """A ViT whose attention layers are `RefinerAttention`.

    Args:
        expansion, kernel_size, mode, constraint, init: the refiner's (see `AttentionRefiner`).
        share_blocks: s > 0 makes each group of s + 1 blocks one that computes its softmax map
            and s that reuse it (Table 13); in mode "official" the computing block does not
            refine (as released).
        **kwargs: `VisionTransformer` arguments.
    """

    def __init__(
        self,
        expansion: int = 3,
        kernel_size: int = 3,
        mode: str = "paper",
        constraint: str = "none",
        init: str = "default",
        share_blocks: int = 0,
        weight_init: str = "",
        **kwargs,
    ) -> None:
        super().__init__(weight_init="skip", **kwargs)
        if share_blocks < 0 or share_blocks >= len(self.blocks):
            raise ValueError(
                f"share_blocks must be in 0..{len(self.blocks) - 1}; got {share_blocks}."
            )
        self.share_blocks = share_blocks
        refiner = {"expansion": expansion, "kernel_size": kernel_size, "mode": mode,
                   "constraint": constraint, "init": init,
                   "num_prefix_tokens": self.num_prefix_tokens}  # fmt: skip
        layer = partial(
            RefinerAttention, self.embed_dim, self.blocks[0].attn.num_heads,
            qkv_bias=kwargs.get("qkv_bias", True), qk_norm=kwargs.get("qk_norm", False),
            attn_drop=kwargs.get("attn_drop_rate", 0.0),
            proj_drop=kwargs.get("proj_drop_rate", 0.0),
        )  # fmt: skip
        relay = None
        for i, block in enumerate(self.blocks):  # timm built plain `Attention`; swap it
            if share_blocks and i % (share_blocks + 1):
                block.attn = layer(source=relay, **refiner)
            else:
                block.attn = layer(refine=not (share_blocks and mode == "official"), **refiner)
                relay = block.attn.relay = AttentionRelay() if share_blocks else None
        if weight_init != "skip":
            self.init_weights(weight_init)

    def forward_features(self, x: Tensor, *args, **kwargs) -> Tensor:
        try:
            return super().forward_features(x, *args, **kwargs)
        finally:
            if self.share_blocks:
                clear_relays(self)

    def forward_intermediates(self, x: Tensor, *args, **kwargs):
        try:
            return super().forward_intermediates(x, *args, **kwargs)
        finally:
            if self.share_blocks:
                clear_relays(self)


def refined_vit_params(name: str) -> dict:
    """Parameters of a registered ``vizkit_refined_vit_{base,s,m,l}`` (built on the meta device)
    beside Table 10's: ``{"params": n, "paper": p, "diff": n - p}``."""
    if name not in PAPER_TABLE10:
        raise KeyError(f"{name!r} is not a Table 10 model; those are {', '.join(PAPER_TABLE10)}.")
    params = param_count(name)
    paper = PAPER_TABLE10[name][3]
    return {"params": params, "paper": paper, "diff": params - paper}


_SHAPES_CFG = {"input_size": (3, 32, 32), "num_classes": 10, "mean": SHAPES_MEAN,
               "std": SHAPES_STD, "crop_pct": 1.0, "first_conv": "patch_embed.proj"}  # fmt: skip
_PAPER_CFG = {"input_size": (3, 224, 224), "num_classes": 1000, "mean": (0.5,) * 3,
              "std": (0.5,) * 3, "interpolation": "bicubic",
              "first_conv": "patch_embed.proj.0"}  # fmt: skip
default_cfgs = generate_default_cfgs(
    {
        "vizkit_refined_vit_tiny": _SHAPES_CFG,
        "vizkit_refined_vit_tiny_official": _SHAPES_CFG,
        "vizkit_refined_vit_base": {
            **_PAPER_CFG,
            "crop_pct": 0.9,
            "first_conv": "patch_embed.proj",
        },
        "vizkit_refined_vit_s": {**_PAPER_CFG, "crop_pct": 0.9},
        "vizkit_refined_vit_m": {**_PAPER_CFG, "crop_pct": 1.0},
        "vizkit_refined_vit_l": {**_PAPER_CFG, "crop_pct": 1.13},  # the RFC ratio of Table 5
    }
)


def _build(variant: str, pretrained: bool, **kwargs) -> RefinedViT:
    return build_model_with_cfg(RefinedViT, variant, pretrained, **kwargs)


@register_model
def vizkit_refined_vit_tiny(pretrained: bool = False, **kwargs) -> RefinedViT:
    """Tiny Refined-ViT (32 px, patch 4, d 96, depth 6, 4 heads), paper-mode refiner r 3, k 3."""
    return _build("vizkit_refined_vit_tiny", pretrained, **{**TINY_REFINED, **kwargs})


@register_model
def vizkit_refined_vit_tiny_official(pretrained: bool = False, **kwargs) -> RefinedViT:
    """The tiny shape with the released code's refiner: official mode, every second block
    sharing the previous block's map."""
    config = {**TINY_REFINED, "mode": "official", "share_blocks": 1, **kwargs}
    return _build("vizkit_refined_vit_tiny_official", pretrained, **config)


def _paper(variant: str, pretrained: bool, **kwargs) -> RefinedViT:
    depth, dim, heads, _ = PAPER_TABLE10[variant]
    config = {"patch_size": 16, "embed_dim": dim, "depth": depth, "num_heads": heads,
              "mlp_ratio": 3.0, "mode": "official", "share_blocks": 1,
              "embed_layer": ConvStemPatchEmbed, "norm_layer": partial(nn.LayerNorm, eps=1e-6),
              **kwargs}  # fmt: skip
    return _build(variant, pretrained, **config)


@register_model
def vizkit_refined_vit_base(pretrained: bool = False, **kwargs) -> RefinedViT:
    """Refined-ViT-Base (Table 10: 12 blocks, 768, 12 heads, 86M): ViT-B/16 with a paper-mode
    refiner (r 3, k 3) in every block."""
    kwargs = {"mlp_ratio": 4.0, "mode": "paper", "share_blocks": 0, "embed_layer": PatchEmbed,
              **kwargs}  # fmt: skip
    return _paper("vizkit_refined_vit_base", pretrained, **kwargs)


@register_model
def vizkit_refined_vit_s(pretrained: bool = False, **kwargs) -> RefinedViT:
    """Refined-ViT-S (Table 10: 16 blocks, 384, 12 heads, 25M), as released."""
    return _paper("vizkit_refined_vit_s", pretrained, **kwargs)


@register_model
def vizkit_refined_vit_m(pretrained: bool = False, **kwargs) -> RefinedViT:
    """Refined-ViT-M (Table 10: 32 blocks, 420, 12 heads, 55M), as released."""
    return _paper("vizkit_refined_vit_m", pretrained, **kwargs)


@register_model
def vizkit_refined_vit_l(pretrained: bool = False, **kwargs) -> RefinedViT:
    """Refined-ViT-L (Table 10: 32 blocks, 512, 16 heads, 81M), as released."""
    return _paper("vizkit_refined_vit_l", pretrained, **kwargs)
