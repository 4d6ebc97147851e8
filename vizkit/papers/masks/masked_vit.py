"""ViTs with learned attention masks ("RetNet Viewed through Convolution", Li and Zhang 2023, § 3):
timm's `VisionTransformer` with `ELMAttention` or `GMMAttention` in every block, and the paper's
class-token-free baseline (global average pooling, qkv without bias, MLP ratio 2).

Registered, for each configuration below: ``vizkit_gap_vit_{cfg}`` (baseline),
``vizkit_elm_vit_{cfg}`` and ``vizkit_gmm_vit_{cfg}``. ``tiny`` is the CPU model (32 px, patch 4:
an 8 x 8 grid, the paper's 64 x 64 mask); the others are the paper's CIFAR / Tiny-ImageNet
configurations, with the K and head sharing of the table that uses them (`PAPER_COUNTS` lists
every parameter count the paper prints).
"""

from __future__ import annotations

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from ...datasets.shapes import SHAPES_MEAN, SHAPES_STD
from ...models.counting import param_count
from .attention_masks import DecayMask, LocalMask
from .masked_attention import ELMAttention, GMMAttention, MaskedAttention

__all__ = [
    "DECAY_MASKS",
    "MASKS",
    "MaskedViT",
    "PAPER_CONFIGS",
    "PAPER_COUNTS",
    "masked_vit_params",
]

MASKS = ("none", "elm", "gmm")  # registered for every configuration
DECAY_MASKS = ("retnet", "rmt", "local")  # the decays the paper starts from: the tiny model
_PAPER_VIT = {"img_size": 32, "patch_size": 4, "mlp_ratio": 2.0, "qkv_bias": False,
              "class_token": False, "global_pool": "avg", "num_classes": 10}  # fmt: skip


def _cifar(dim: int, depth: int, kernels: int) -> tuple[dict, dict]:
    """A CIFAR configuration (12 heads) with a head-shared K-kernel GMM, as its table."""
    model = {"embed_dim": dim, "depth": depth, "num_heads": 12}
    return model, {"num_kernels": kernels, "share_heads": True}


# name -> (model kwargs, GMM kwargs), as in the authors' released code
PAPER_CONFIGS = {
    "tiny": ({"embed_dim": 64, "depth": 4, "num_heads": 4}, {"num_kernels": 5}),
    "d6": _cifar(252, 6, 5),  # Table 3
    "d9": _cifar(192, 9, 3),  # Table 3 (Table 6 has K 8)
    "d15": _cifar(144, 15, 5),  # Tables 2, 3, 6
    "d30": _cifar(108, 30, 3),  # Table 3
    "d60": _cifar(72, 60, 3),  # Table 3
    "d30w": _cifar(192, 30, 5),  # Table 4
    "heat": (  # Table 5, Fig. 7: Tiny-ImageNet at patch 4, per-head GMM
        {"img_size": 64, "embed_dim": 192, "depth": 8, "num_heads": 6, "num_classes": 200},
        {"num_kernels": 5},
    ),
}
# (table, registered model, kwargs, parameters as printed in the paper)
PAPER_COUNTS = [
    ("Table 3", "vizkit_gap_vit_d6", {}, 3_091_798),
    ("Table 3", "vizkit_gmm_vit_d6", {}, 3_091_858),
    ("Table 3", "vizkit_gap_vit_d9", {}, 2_692_042),
    ("Table 3", "vizkit_gmm_vit_d9", {}, 2_692_096),
    ("Table 3", "vizkit_gap_vit_d15", {}, 2_523_610),
    ("Table 3", "vizkit_gmm_vit_d15", {}, 2_523_760),
    ("Table 3", "vizkit_gap_vit_d30", {}, 2_838_790),
    ("Table 3", "vizkit_gmm_vit_d30", {}, 2_838_970),
    ("Table 3", "vizkit_gap_vit_d60", {}, 2_531_890),
    ("Table 3", "vizkit_gmm_vit_d60", {}, 2_532_250),
    ("Table 4", "vizkit_gmm_vit_d30w", {}, 8_917_750),
    ("Table 5", "vizkit_gap_vit_heat", {}, 2_469_128),
    ("Table 5", "vizkit_elm_vit_heat", {}, 2_993_416),
    ("Table 5", "vizkit_gmm_vit_heat", {}, 2_469_608),
    ("Table 6", "vizkit_gap_vit_d9", {}, 2_692_042),
    ("Table 6", "vizkit_elm_vit_d9", {}, 2_728_906),
    ("Table 6", "vizkit_gmm_vit_d9", {"num_kernels": 8}, 2_692_186),
    ("Table 6", "vizkit_gap_vit_d15", {}, 2_523_610),
    ("Table 6", "vizkit_elm_vit_d15", {}, 2_585_050),
    ("Table 6", "vizkit_gmm_vit_d15", {}, 2_523_760),
    ("Table 6", "vizkit_gap_vit_d9", {"num_classes": 100}, 2_709_412),
    ("Table 6", "vizkit_elm_vit_d9", {"num_classes": 100}, 2_746_276),
    ("Table 6", "vizkit_gmm_vit_d9", {"num_kernels": 8, "num_classes": 100}, 2_709_556),
    ("Table 6", "vizkit_gap_vit_d15", {"num_classes": 100}, 2_536_660),
    ("Table 6", "vizkit_elm_vit_d15", {"num_classes": 100}, 2_598_100),
    ("Table 6", "vizkit_gmm_vit_d15", {"num_classes": 100}, 2_536_810),
]


class MaskedViT(VisionTransformer):
    """A ViT whose attention layers multiply a learned mask into their scores.

    Args:
        mask: "none" (timm's attention: the baseline), "elm", "gmm", or a decay the paper
            starts from: "retnet" (RetNet's causal gamma^(n - m) over the patches in raster
            order), "rmt" (RMT's Manhattan gamma^(|dx| + |dy|)), both with RetNet's gamma per
            head, or "local" (1 within ``radius`` patches). Each multiplies the scores, as
            ELM and GMM do.
        num_kernels, share_heads, eps, official_underflow: the GMM's (see `GMMAttention`).
        learnable_gamma: learn the decays' gamma (else fixed). radius: the local mask's.
        freeze_mask: keep the masks' parameters at their initialisation (``requires_grad``
            False): the frozen-mask control, a locality prior that is not learned.
        **kwargs: `VisionTransformer` arguments.

    Each input's patch grid is passed to the attention layers (in ``_pos_embed``, which every
    forward path calls), so a GMM model runs at other resolutions (``dynamic_img_size=True``);
    an ELM model only on its training grid.
    """

    def __init__(
        self,
        mask: str = "gmm",
        num_kernels: int = 5,
        share_heads: bool = False,
        eps: float | None = None,
        official_underflow: bool = False,
        learnable_gamma: bool = False,
        radius: int = 1,
        freeze_mask: bool = False,
        weight_init: str = "",
        **kwargs,
    ) -> None:
        if mask not in (*MASKS, *DECAY_MASKS):
            known = ", ".join(map(repr, (*MASKS, *DECAY_MASKS)))
            raise ValueError(f"mask must be one of {known}; got {mask!r}.")
        super().__init__(weight_init="skip", **kwargs)
        self.mask_type = mask
        if mask != "none":
            common = {"qkv_bias": kwargs.get("qkv_bias", True),
                      "qk_norm": kwargs.get("qk_norm", False),
                      "attn_drop": kwargs.get("attn_drop_rate", 0.0),
                      "proj_drop": kwargs.get("proj_drop_rate", 0.0),
                      "num_prefix_tokens": self.num_prefix_tokens}  # fmt: skip
            if mask == "elm":
                layer = {"cls": ELMAttention, "grid": self.patch_embed.grid_size}
            elif mask in DECAY_MASKS:
                layer = {"cls": MaskedAttention}
            else:
                gmm = {"num_kernels": num_kernels, "share_heads": share_heads,
                       "official_underflow": official_underflow}  # fmt: skip
                layer = {"cls": GMMAttention, **gmm, **({"eps": eps} if eps is not None else {})}
            cls = layer.pop("cls")
            for block in self.blocks:  # timm built plain `Attention`; swap it
                heads = block.attn.num_heads
                if mask in DECAY_MASKS:
                    layer["mask"] = (LocalMask(radius) if mask == "local" else DecayMask(
                        heads, "causal" if mask == "retnet" else "manhattan",
                        learnable=learnable_gamma))  # fmt: skip
                block.attn = cls(self.embed_dim, heads, **common, **layer)
        if weight_init != "skip":
            self.init_weights(weight_init)
        if freeze_mask and (mask == "elm" or learnable_gamma):
            raise ValueError(
                "freeze_mask keeps a learned mask at its initialisation: the ELM starts at zero "
                "(frozen, attention stays uniform) and a learnable gamma frozen is the fixed "
                "decay (learnable_gamma=False). Freeze 'gmm', whose random init is a prior."
            )
        if freeze_mask:
            frozen = [param for block in self.blocks if isinstance(block.attn, MaskedAttention)
                      for param in block.attn.mask.parameters()]  # fmt: skip
            if not frozen:
                raise ValueError(f"freeze_mask: mask {mask!r} has no parameters to freeze.")
            for param in frozen:
                param.requires_grad_(False)

    def _pos_embed(self, x: Tensor) -> Tensor:
        """timm's, after passing the input's patch grid to the masked layers: x is (B, gh, gw,
        C) with ``dynamic_img_size``, else (B, Np, C) on the fixed grid."""
        grid = tuple(x.shape[1:3]) if x.ndim == 4 else tuple(self.patch_embed.grid_size)
        for layer in (b.attn for b in self.blocks if isinstance(b.attn, MaskedAttention)):
            if self.mask_type != "elm":  # masks of patch offsets: any grid
                layer.grid_size = grid
            elif tuple(grid) != layer.mask.grid:
                layer.mask(grid)  # raises the ELM's error before any work
        return super()._pos_embed(x)


def masked_vit_params(name: str, **kwargs) -> int:
    """Parameter count of a registered model (built on the meta device, so the paper's sizes
    cost nothing)."""
    return param_count(name, **kwargs)


_SHAPES_CFG = {"input_size": (3, 32, 32), "num_classes": 10, "mean": SHAPES_MEAN,
               "std": SHAPES_STD, "crop_pct": 1.0, "first_conv": "patch_embed.proj"}  # fmt: skip
_CIFAR_CFG = {**_SHAPES_CFG, "mean": (0.4914, 0.4822, 0.4465), "std": (0.2470, 0.2435, 0.2616)}
_TINY_IMAGENET_CFG = {**_CIFAR_CFG, "input_size": (3, 64, 64), "num_classes": 200,
                      "mean": (0.4802, 0.4481, 0.3975),
                      "std": (0.2770, 0.2691, 0.2821)}  # fmt: skip


_PREFIX = {"none": "gap", "elm": "elm", "gmm": "gmm", "retnet": "retnet", "rmt": "rmt",
           "local": "local"}  # fmt: skip


def _masked_vit(name: str, mask: str, config: str, pretrained: bool, /, **kwargs) -> MaskedViT:
    """The registered model ``name``: ``mask`` in every block of `PAPER_CONFIGS` ``config``
    (keyword arguments override it)."""
    model_kwargs, gmm_kwargs = PAPER_CONFIGS[config]
    base = {**_PAPER_VIT, **model_kwargs, "mask": mask, **(gmm_kwargs if mask == "gmm" else {})}
    return build_model_with_cfg(MaskedViT, name, pretrained, **{**base, **kwargs})


default_cfgs = generate_default_cfgs(
    {
        f"vizkit_{_PREFIX[mask]}_vit_{config}": (
            _SHAPES_CFG
            if config == "tiny"
            else _TINY_IMAGENET_CFG
            if config == "heat"
            else _CIFAR_CFG
        )
        for mask in MASKS
        for config in PAPER_CONFIGS
    }
    | {f"vizkit_{mask}_vit_tiny": _SHAPES_CFG for mask in DECAY_MASKS}
)


@register_model
def vizkit_gap_vit_tiny(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "tiny"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_tiny", "none", "tiny", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_d6(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "d6"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_d6", "none", "d6", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_d9(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "d9"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_d9", "none", "d9", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_d15(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "d15"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_d15", "none", "d15", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_d30(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "d30"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_d30", "none", "d30", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_d60(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "d60"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_d60", "none", "d60", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_d30w(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "d30w"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_d30w", "none", "d30w", pretrained, **kwargs)


@register_model
def vizkit_gap_vit_heat(pretrained: bool = False, **kwargs) -> MaskedViT:
    """The paper's baseline ViT (no class token, global average pooling); configuration "heat"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gap_vit_heat", "none", "heat", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_tiny(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "tiny"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_tiny", "elm", "tiny", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_d6(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "d6"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_d6", "elm", "d6", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_d9(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "d9"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_d9", "elm", "d9", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_d15(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "d15"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_d15", "elm", "d15", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_d30(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "d30"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_d30", "elm", "d30", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_d60(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "d60"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_d60", "elm", "d60", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_d30w(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "d30w"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_d30w", "elm", "d30w", pretrained, **kwargs)


@register_model
def vizkit_elm_vit_heat(pretrained: bool = False, **kwargs) -> MaskedViT:
    """ELM-ViT: an element-wise learned mask in every block; configuration "heat"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_elm_vit_heat", "elm", "heat", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_tiny(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "tiny" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_tiny", "gmm", "tiny", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_d6(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "d6" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_d6", "gmm", "d6", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_d9(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "d9" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_d9", "gmm", "d9", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_d15(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "d15" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_d15", "gmm", "d15", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_d30(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "d30" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_d30", "gmm", "d30", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_d60(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "d60" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_d60", "gmm", "d60", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_d30w(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "d30w" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_d30w", "gmm", "d30w", pretrained, **kwargs)


@register_model
def vizkit_gmm_vit_heat(pretrained: bool = False, **kwargs) -> MaskedViT:
    """GMM-ViT: a Gaussian mixture mask in every block; configuration "heat" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_gmm_vit_heat", "gmm", "heat", pretrained, **kwargs)


@register_model
def vizkit_retnet_vit_tiny(pretrained: bool = False, **kwargs) -> MaskedViT:
    """RetNet's causal decay gamma^(n - m) multiplying the scores in every block; configuration
    "tiny" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_retnet_vit_tiny", "retnet", "tiny", pretrained, **kwargs)


@register_model
def vizkit_rmt_vit_tiny(pretrained: bool = False, **kwargs) -> MaskedViT:
    """RMT's Manhattan decay gamma^(|dx| + |dy|) multiplying the scores in every block;
    configuration "tiny" (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_rmt_vit_tiny", "rmt", "tiny", pretrained, **kwargs)


@register_model
def vizkit_local_vit_tiny(pretrained: bool = False, **kwargs) -> MaskedViT:
    """A 3 x 3 local window multiplying the scores in every block; configuration "tiny"
    (`PAPER_CONFIGS`)."""
    return _masked_vit("vizkit_local_vit_tiny", "local", "tiny", pretrained, **kwargs)
