"""SoT (Xie et al. 2022, § 3.1, Supp. A, Table S-1, Fig. S-1): `with_sot_head` puts SoT's head on a
timm ViT; `SoTViT` is the paper's network (DenseNet token embedding, ViT blocks, the head).

Registered: ``vizkit_sot_micro`` (the CPU model: 32 px, patch 4, 64 tokens of size 64, 4 blocks;
MGCrP 6 heads of 6 x 6), ``vizkit_sot_micro_dense`` (the same with the paper's token embedding
and fixed positions: 4 x 4 tokens), ``vizkit_sot_7`` (the 7-layer ablation model of Tables 3-4,
112 px) and ``vizkit_sot_tiny``, ``vizkit_sot_small``, ``vizkit_sot_base`` (Table S-1). Each takes
``fusion``, ``pool`` and the pooling's keyword arguments (see `vizkit.papers.sot.SoTHead`).
"""

from __future__ import annotations

import torch
from timm.layers import ClassifierHead, PatchEmbed
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from ...datasets.shapes import SHAPES_MEAN, SHAPES_STD
from .classification_head import SoTHead

__all__ = ["PAPER_COUNTS", "DenseNetPatchEmbed", "SoTViT", "sinusoid_table",
           "with_sot_head"]  # fmt: skip


def with_sot_head(
    model: VisionTransformer,
    fusion: str | None = None,
    pool: str = "mgcrp",
    num_classes: int | None = None,
    **head_kwargs,
) -> VisionTransformer:
    """Replace a timm ViT's pooling and classifier by a `SoTHead` (in place; returns the model).

    The head reads all tokens after the final norm (and after ``fc_norm``, per token, for
    average-pooling ViTs); the class token is token 0, the word tokens follow the
    ``num_prefix_tokens`` prefix tokens (class, register tokens). ``fusion`` defaults to "sum",
    or to "wordt" for a model without a class token. Swin-style models (a head pooling a
    (B, H, W, C) map) get a WordT head on every position, as the paper does for Swin.

    Args:
        model: a timm `VisionTransformer` (or subclass) that keeps its ``forward_head``, or a
            Swin-style model.
        fusion, pool, **head_kwargs: see `SoTHead`.
        num_classes: default the model's.
    """
    nhwc = _nhwc_head(model)
    if not nhwc and (
        not isinstance(model, VisionTransformer)
        or type(model).forward_head is not VisionTransformer.forward_head
    ):
        raise TypeError(
            f"with_sot_head takes a timm VisionTransformer that keeps its forward_head (ViT, DeiT, "
            f"vizkit's ViTs) or a model whose head pools a (B, H, W, C) map (Swin); got "
            f"{type(model).__name__}. Distilled DeiT and CaiT route only the class tokens to "
            "their heads."
        )
    has_class_token = not nhwc and model.has_class_token
    fusion = fusion or ("sum" if has_class_token else "wordt")
    if not has_class_token and fusion != "wordt":
        raise ValueError(
            f"{type(model).__name__} has no class token, so only fusion 'wordt' applies; "
            f"got {fusion!r}."
        )
    num_classes = model.num_classes if num_classes is None else num_classes
    reference = next(model.parameters())
    if nhwc:  # every position of the map is a word token
        head = SoTHead(model.num_features, num_classes, fusion, pool, 0, **head_kwargs)
    else:
        head = SoTHead(model.embed_dim, num_classes, fusion, pool, model.num_prefix_tokens,
                       **head_kwargs)  # fmt: skip
        model.global_pool, model.attn_pool = "", None
    model.head, model.num_classes = head.to(reference.device, reference.dtype), num_classes
    return model


def _nhwc_head(model: nn.Module) -> bool:
    """Whether the model's head is timm's ClassifierHead on a (B, H, W, C) map (Swin)."""
    head = getattr(model, "head", None)
    return isinstance(head, ClassifierHead) and getattr(head, "input_fmt", "") == "NHWC"


def sinusoid_table(positions: int, dim: int) -> torch.Tensor:
    """The transformer's fixed sinusoidal table (1, positions, dim), as SoT's released code uses
    for its position embedding: sin on even channels, cos on odd ones."""
    pos = torch.arange(positions, dtype=torch.float64)[:, None]
    rate = torch.pow(10000.0, 2 * (torch.arange(dim) // 2) / dim)
    angle = pos / rate
    table = torch.where(torch.arange(dim) % 2 == 0, angle.sin(), angle.cos())
    return table.float()[None]


class _DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (to bn_size * growth) - BN-ReLU-3x3 conv (to growth); output concatenated
    to the input: (B, c, h, w) -> (B, c + growth, h, w)."""

    def __init__(self, channels: int, growth: int, bn_size: int) -> None:
        super().__init__()
        width = bn_size * growth
        self.body = nn.Sequential(
            nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
            nn.Conv2d(channels, width, 1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, growth, 3, padding=1, bias=False),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


def _dense_stage(channels: int, out: int, pool: bool, layers: int = 6, growth: int = 16,
                 bn_size: int = 2) -> nn.Sequential:  # fmt: skip
    """A dense block and its transition (BN, 1x1 conv to ``out``, 2x2 average pool)."""
    stage = [_DenseLayer(channels + i * growth, growth, bn_size) for i in range(layers)]
    grown = channels + layers * growth
    stage += [nn.BatchNorm2d(grown), nn.Conv2d(grown, out, 1, bias=False)]
    return nn.Sequential(*stage, nn.AvgPool2d(2) if pool else nn.Identity())


class DenseNetPatchEmbed(PatchEmbed):
    """SoT's token embedding (§ 3.1, Fig. S-1a, released ``DenseBlock(6, growth 16, bn_size 2)``):
    3x3 conv (3 -> 64) + 3x3/2 max-pool, three dense stages (64 -> 128 -> 128 -> 128, each
    halving the size), 1x1 conv to the token size: (B, 3, H, W) -> (B, Np, C).

    ``patch_size`` 16 (224 px -> 14 x 14) or 8 (the 7-layer model at 112 px: the last stage does not
    downsample, as released)."""

    def __init__(self, img_size=224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768,
                 **kwargs) -> None:  # fmt: skip
        if patch_size not in (8, 16):
            raise ValueError(f"The DenseNet embedding downsamples by 8 or 16; got {patch_size}.")
        super().__init__(img_size, patch_size, in_chans, embed_dim, **kwargs)
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, 64, 3, padding=1), nn.MaxPool2d(3, 2, 1),
            _dense_stage(64, 128, pool=True), _dense_stage(128, 128, pool=True),
            _dense_stage(128, 128, pool=patch_size == 16), nn.Conv2d(128, embed_dim, 1),
        )  # fmt: skip


class SoTViT(VisionTransformer):
    """A ViT with SoT's head (and optionally its token embedding and fixed position table).

    Args:
        fusion, pool, late, head_dropout: the head's (`SoTHead`).
        mgcrp_heads, m: MGCrP's h and m (= n); for "gcp" they set the reduced size (GCP's output
            size then matches MGCrP's); unused for "gap".
        token_embed: "linear" (timm's patch projection) or "densenet" (`DenseNetPatchEmbed`).
        sincos_pos_embed: a fixed sinusoidal position table (the released code) instead of a
            learned one.
        pool_kwargs: further arguments of the pooling (`MGCrP`: alpha, norm, num_sv, ...).
        **kwargs: `VisionTransformer` arguments.
    """

    def __init__(
        self,
        fusion: str = "sum",
        pool: str = "mgcrp",
        mgcrp_heads: int = 6,
        m: int = 14,
        late: str = "paper",
        head_dropout: float = 0.0,
        token_embed: str = "linear",
        sincos_pos_embed: bool = False,
        pool_kwargs: dict | None = None,
        **kwargs,
    ) -> None:
        if token_embed not in ("linear", "densenet"):
            raise ValueError(f"token_embed must be 'linear' or 'densenet'; got {token_embed!r}.")
        if token_embed == "densenet":
            kwargs["embed_layer"] = DenseNetPatchEmbed
        super().__init__(**kwargs)
        if sincos_pos_embed:
            self.pos_embed.requires_grad_(False)
            self.pos_embed.data.copy_(sinusoid_table(self.pos_embed.shape[1], self.embed_dim))
        pool_kwargs = dict(pool_kwargs or {})
        if pool != "gap":
            pool_kwargs = {"num_heads": mgcrp_heads, "m": m, **pool_kwargs}
        with_sot_head(self, fusion, pool, late=late, dropout=head_dropout, **pool_kwargs)


_SOT_BLOCKS = {"qkv_bias": False, "class_token": True, "global_pool": "token",
               "drop_path_rate": 0.1}  # fmt: skip
_PAPER = {"token_embed": "densenet", "sincos_pos_embed": True}
# name -> (ViT kwargs, head kwargs); Table S-1 and the authors' released configs
CONFIGS = {
    "micro": ({"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 4, "num_heads": 4,
               "mlp_ratio": 2.0, "num_classes": 10, "qkv_bias": False},
              {"mgcrp_heads": 6, "m": 6}),
    "micro_dense": ({"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 4,
                     "num_heads": 4, "mlp_ratio": 2.0, "num_classes": 10, "qkv_bias": False},
                    {**_PAPER, "mgcrp_heads": 6, "m": 6}),
    "7": ({**_SOT_BLOCKS, "img_size": 112, "patch_size": 8, "embed_dim": 256, "depth": 7,
           "num_heads": 4, "mlp_ratio": 2.0}, {**_PAPER, "mgcrp_heads": 6, "m": 14}),
    "tiny": ({**_SOT_BLOCKS, "embed_dim": 240, "depth": 12, "num_heads": 4, "mlp_ratio": 2.5},
             {**_PAPER, "mgcrp_heads": 6, "m": 14}),
    "small": ({**_SOT_BLOCKS, "embed_dim": 384, "depth": 14, "num_heads": 6, "mlp_ratio": 3.5},
              {**_PAPER, "mgcrp_heads": 6, "m": 24, "head_dropout": 0.5}),
    "base": ({**_SOT_BLOCKS, "embed_dim": 528, "depth": 24, "num_heads": 8, "mlp_ratio": 3.0},
             {**_PAPER, "mgcrp_heads": 6, "m": 38, "head_dropout": 0.7}),
}  # fmt: skip
# (table, registered model, kwargs, parameters in millions as printed); the paper counts trainable
# parameters (`param_count(name, trainable_only=True, **kwargs)`; the position table is fixed)
PAPER_COUNTS = [
    ("Table S-1", "vizkit_sot_tiny", {}, 7.7),
    ("Table S-1", "vizkit_sot_small", {}, 26.9),
    ("Table S-1", "vizkit_sot_base", {}, 76.8),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "classt"}, 4.23),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "aggr_all", "pool": "gap"}, 4.22),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "aggr_all", "pool": "gcp"}, 5.15),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "aggr_all"}, 5.20),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "concat", "pool": "gap"}, 4.73),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "concat", "pool": "gcp"}, 5.66),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "concat"}, 5.71),
    ("Table 3(b)", "vizkit_sot_7", {"pool": "gap"}, 4.47),
    ("Table 3(b)", "vizkit_sot_7", {"pool": "gcp"}, 5.40),
    ("Table 3(b)", "vizkit_sot_7", {}, 5.44),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "late", "pool": "gap"}, 4.47),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "late", "pool": "gcp"}, 5.40),
    ("Table 3(b)", "vizkit_sot_7", {"fusion": "late"}, 5.46),
]

_SHAPES_CFG = {"input_size": (3, 32, 32), "num_classes": 10, "mean": SHAPES_MEAN,
               "std": SHAPES_STD, "crop_pct": 1.0, "first_conv": "patch_embed.proj"}  # fmt: skip
_IMAGENET_CFG = {"input_size": (3, 224, 224), "num_classes": 1000, "crop_pct": 0.875,
                 "first_conv": "patch_embed.proj.0"}  # fmt: skip
# keyword arguments of a vizkit_sot_* entrypoint that go to the pooling (`MGCrP`, GCP)
_POOL_KEYS = {"alpha", "norm", "num_sv", "num_iter", "center", "v0_init", "code_faithful",
              "n", "reduced"}  # fmt: skip


def _sot_vit(name: str, config: str, pretrained: bool, /, **kwargs) -> SoTViT:
    """The registered model ``name`` of `CONFIGS` ``config`` (keyword arguments override it;
    the pooling's go to ``pool_kwargs``)."""
    vit, head = CONFIGS[config]
    pooling = {k: kwargs.pop(k) for k in list(kwargs) if k in _POOL_KEYS}
    pooling = {**kwargs.pop("pool_kwargs", {}), **pooling}
    return build_model_with_cfg(
        SoTViT, name, pretrained, **{**vit, **head, **kwargs}, pool_kwargs=pooling
    )


default_cfgs = generate_default_cfgs(
    {
        f"vizkit_sot_{c}": _SHAPES_CFG
        if c == "micro"
        else {**_SHAPES_CFG, "first_conv": "patch_embed.proj.0"}
        if c == "micro_dense"
        else _IMAGENET_CFG
        for c in CONFIGS
    }
)


@register_model
def vizkit_sot_micro(pretrained: bool = False, **kwargs) -> SoTViT:
    """SoT-Micro, the CPU model (Shapes / Digits, 32 px); configuration "micro" (`CONFIGS`)."""
    return _sot_vit("vizkit_sot_micro", "micro", pretrained, **kwargs)


@register_model
def vizkit_sot_micro_dense(pretrained: bool = False, **kwargs) -> SoTViT:
    """SoT-Micro with the paper's DenseNet token embedding (4 x 4 tokens); configuration
    "micro_dense" (`CONFIGS`)."""
    return _sot_vit("vizkit_sot_micro_dense", "micro_dense", pretrained, **kwargs)


@register_model
def vizkit_sot_7(pretrained: bool = False, **kwargs) -> SoTViT:
    """the 7-layer SoT of the ablations (Tables 3-4; 112 px, token size 256); configuration "7"
    (`CONFIGS`)."""
    return _sot_vit("vizkit_sot_7", "7", pretrained, **kwargs)


@register_model
def vizkit_sot_tiny(pretrained: bool = False, **kwargs) -> SoTViT:
    """SoT-Tiny (Table S-1); configuration "tiny" (`CONFIGS`)."""
    return _sot_vit("vizkit_sot_tiny", "tiny", pretrained, **kwargs)


@register_model
def vizkit_sot_small(pretrained: bool = False, **kwargs) -> SoTViT:
    """SoT-Small (Table S-1); configuration "small" (`CONFIGS`)."""
    return _sot_vit("vizkit_sot_small", "small", pretrained, **kwargs)


@register_model
def vizkit_sot_base(pretrained: bool = False, **kwargs) -> SoTViT:
    """SoT-Base (Table S-1); configuration "base" (`CONFIGS`)."""
    return _sot_vit("vizkit_sot_base", "base", pretrained, **kwargs)
