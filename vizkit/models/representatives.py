"""The small representatives that tests, docs and the coverage table build for each family:
one small model of every timm model module (`FAMILIES`) and of each other library's families
(`LIBRARIES`), shrunk in depth and width but keeping each family's mechanism, random init."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from timm.models import _registry
from torch import nn

__all__ = [
    "FAMILIES",
    "LIBRARIES",
    "LibraryModel",
    "Representative",
    "small_sam_config",
    "timm_families",
]


@dataclass(frozen=True)
class Representative:
    """One small model of a family: a timm name, constructor overrides that shrink it (depth,
    width), and the image side it runs at."""

    model: str
    size: int = 64
    kwargs: dict = field(default_factory=dict)


_SMALL_VIT = {"depth": 2, "embed_dim": 64, "num_heads": 2}
# a classifier head for the families whose timm default is a backbone (num_classes=0), so that
# class targets mean a class (vizkit refuses them on embeddings)
_HEAD = {"num_classes": 10}

# timm model module -> its representative (transformer families first in mind: kwargs keep each
# one's mechanism, e.g. window sizes and stage counts, while cutting depth and width)
FAMILIES: dict[str, Representative] = {
    "beit": Representative("beit_base_patch16_224", 64, {"img_size": 64, **_SMALL_VIT}),
    "byoanet": Representative("botnet26t_256", 128, {"img_size": 128}),
    "byobnet": Representative("test_byobnet", 64),
    "cait": Representative("cait_xxs24_224", 64, {"img_size": 64, **_SMALL_VIT}),
    "coat": Representative("coat_lite_tiny", 64, {"img_size": 64}),
    "convit": Representative(
        "convit_tiny", 64, {"img_size": 64, "depth": 3, "local_up_to_layer": 2}
    ),
    "convmixer": Representative("convmixer_768_32", 64),
    "convnext": Representative("test_convnext", 64),
    "cpubone": Representative("cpubone_nano", 64),
    "crossvit": Representative("crossvit_tiny_240", 240, {"depth": [[1, 1, 0]] * 3}),
    "csatv2": Representative("csatv2", 64),
    "cspnet": Representative("cs3darknet_focus_s", 64),
    "cspnext": Representative("cspnext_tiny", 64),
    "davit": Representative("davit_tiny", 64, {"depths": (1, 1, 1, 1)}),
    "deepseek_vit": Representative("deepseek_vit_412m", 56, {"img_size": 56, "depth": 2, **_HEAD}),
    "deit": Representative("deit_tiny_distilled_patch16_224", 64, {"img_size": 64, **_SMALL_VIT}),
    "densenet": Representative("densenet121", 64),
    "dla": Representative("dla46x_c", 64),
    "dpn": Representative("dpn48b", 64),
    "edgenext": Representative("edgenext_xx_small", 64),
    "efficientformer": Representative("efficientformer_l1", 224),
    "efficientformer_v2": Representative("efficientformerv2_s0", 64, {"img_size": 64}),
    "efficientnet": Representative("test_efficientnet", 64),
    "efficientvim": Representative("efficientvim_m1", 64),
    "efficientvit_mit": Representative("efficientvit_b0", 64),
    "efficientvit_msra": Representative("efficientvit_m0", 64, {"img_size": 64}),
    "eva": Representative("eva02_tiny_patch14_224", 56, {"img_size": 56, **_SMALL_VIT, **_HEAD}),
    "fasternet": Representative("fasternet_t0", 64),
    "fastvit": Representative("fastvit_sa12", 64),
    "focalnet": Representative("focalnet_tiny_srf", 64),
    "gcvit": Representative("gcvit_xxtiny", 64, {"img_size": 64}),
    "gemma4_vit": Representative("gemma4_vit_167m", 64, {"img_size": 64, "depth": 2, **_HEAD}),
    "ghostnet": Representative("ghostnet_050", 64),
    "hardcorenas": Representative("hardcorenas_b", 64),
    "hgnet": Representative("hgnetv2_b0", 64),
    "hiera": Representative("hiera_tiny_224", 224, {"stages": (1, 1, 1, 1)}),
    "hieradet_sam2": Representative("hieradet_small", 64),
    "hrnet": Representative("hrnet_w18_small", 64),
    "iformer": Representative("iformer_t", 64),
    "inception_next": Representative("inception_next_atto", 64),
    "inception_resnet_v2": Representative("inception_resnet_v2", 96),
    "inception_v3": Representative("inception_v3", 96),
    "inception_v4": Representative("inception_v4", 96),
    "lcnetv2": Representative("lcnetv2_small", 64),
    "levit": Representative("levit_128s", 128, {"img_size": 128}),
    "lowformer": Representative("lowformer_b0", 64),
    "mambaout": Representative("test_mambaout", 64),
    "maxxvit": Representative("maxvit_tiny_tf_224", 64, {"img_size": 64, "depths": (1, 1, 1, 1)}),
    "metaformer": Representative("caformer_s18", 64),
    "mlp_mixer": Representative("gmlp_ti16_224", 64, {"img_size": 64}),
    "mobilenetv3": Representative("mobilenetv3_small_050", 64),
    "mobilenetv5": Representative("mobilenetv5_base", 64),
    "mobilevit": Representative("mobilevit_xxs", 64),
    "mvitv2": Representative("mvitv2_tiny", 64, {"img_size": 64}),
    "naflexvit": Representative("naflexvit_base_patch16_gap", 64, _SMALL_VIT),
    "nasnet": Representative("nasnetalarge", 96),
    "nest": Representative("nest_tiny", 64, {"img_size": 64}),
    "nextvit": Representative("nextvit_small", 64),
    "nfnet": Representative("test_nfnet", 64),
    "pit": Representative("pit_ti_224", 64, {"img_size": 64}),
    "pnasnet": Representative("pnasnet5large", 96),
    "pvt_v2": Representative("pvt_v2_b0", 64),
    "qwen3_vit": Representative("qwen3_vit_88m", 64, {"img_size": 64, "depth": 2, **_HEAD}),
    "rdnet": Representative("rdnet_tiny", 64),
    "regnet": Representative("regnetx_002", 64),
    "repghost": Representative("repghostnet_050", 64),
    "repvit": Representative("repvit_m1", 64),
    "res2net": Representative("res2next50", 64),
    "resnest": Representative("resnest14d", 64),
    "resnet": Representative("test_resnet", 64),
    "resnetv2": Representative("resnetv2_18", 64),
    "rexnet": Representative("rexnet_100", 64),
    "selecsls": Representative("selecsls42", 64),
    "senet": Representative("legacy_seresnet18", 64),
    "sequencer": Representative("sequencer2d_s", 64, {"layers": (1, 1, 1, 1)}),
    "shvit": Representative("shvit_s1", 64),
    "sknet": Representative("skresnet18", 64),
    "starnet": Representative("starnet_s050", 64),
    "swiftformer": Representative("swiftformer_xs", 64),
    "swin_transformer": Representative(
        "swin_tiny_patch4_window7_224", 112, {"img_size": 112, "depths": (2, 2, 2, 2)}
    ),
    "swin_transformer_v2": Representative(
        "swinv2_tiny_window8_256", 128, {"img_size": 128, "window_size": 4, "depths": (2, 2, 2, 2)}
    ),
    "swin_transformer_v2_cr": Representative(
        "swinv2_cr_tiny_224", 112, {"img_size": 112, "depths": (1, 1, 1, 1)}
    ),
    "tiny_vit": Representative("tiny_vit_5m_224", 64),
    "tnt": Representative("tnt_s_legacy_patch16_224", 64, {"img_size": 64, "depth": 2}),
    "tresnet": Representative("tresnet_m", 64),
    "twins": Representative("twins_svt_small", 224, {"depths": (2, 2, 2, 2)}),
    "vgg": Representative("vgg11", 64),
    "visformer": Representative("visformer_tiny", 64, {"img_size": 64}),
    "vision_transformer": Representative(
        "vit_base_patch16_siglip_224", 64, {"img_size": 64, **_SMALL_VIT, **_HEAD}
    ),
    "vision_transformer_hybrid": Representative("vit_tiny_r_s16_p8_224", 64, {"img_size": 64}),
    "vision_transformer_relpos": Representative("test_vit_relpos", 64, {"img_size": 64}),
    "vision_transformer_sam": Representative(
        "samvit_base_patch16_224", 64, {"img_size": 64, **_SMALL_VIT}
    ),
    "vitamin": Representative("vitamin_small_224", 64, {"img_size": 64}),
    "volo": Representative("volo_d1_224", 64, {"img_size": 64}),
    "vovnet": Representative("ese_vovnet19b_slim_dw", 64),
    "xception": Representative("legacy_xception", 96),
    "xception_aligned": Representative("xception41p", 96),
    "xcit": Representative("xcit_nano_12_p16_224", 64, {"img_size": 64, "depth": 2}),
    # vizkit's own models (timm-registered): the four papers' mechanisms
    "cait_variants": Representative("vizkit_cait_tiny_ca2", 32),
    "masked_vit": Representative("vizkit_gmm_vit_tiny", 32),
    "refined_vit": Representative("vizkit_refined_vit_tiny", 32),
    "sot_vit": Representative("vizkit_sot_micro", 32),
}


@dataclass(frozen=True)
class LibraryModel:
    """A small random-init model of another library: a builder (which imports the library
    when called) and the image side it runs at."""

    build: Callable[[], nn.Module]
    size: int = 32


_HF_SMALL = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip


_HF_SWIN = {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [2, 2],
            "num_heads": [2, 2], "window_size": 4}  # fmt: skip


def _transformers(model: str, config: str, nested: str | None = None, **kwargs) -> Callable:
    """A builder of transformers' ``model`` from its ``config`` class (``nested``: the vision
    config's argument name for multi-tower configs), five labels."""

    def build() -> nn.Module:
        import transformers

        settings = {nested: kwargs} if nested else kwargs
        return getattr(transformers, model)(getattr(transformers, config)(num_labels=5, **settings))

    return build


class _LinearProbe(nn.Module):
    """A backbone (no class logits) with a linear probe on its pooled embedding, as a user
    classifies with DINOv3: (B, C, H, W) -> (B, K) logits; ``pool``: the embedding of the
    backbone's output (default `vizkit.targets.embedding_of`)."""

    def __init__(
        self, backbone: nn.Module, dim: int, classes: int = 5, pool: Callable | None = None
    ) -> None:
        super().__init__()
        self.backbone, self.head, self.pool = backbone, nn.Linear(dim, classes), pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..targets import embedding_of

        return self.head((self.pool or embedding_of)(self.backbone(x)))


def _probed(model: str, config: str, dim: int | None = None, pool: Callable | None = None,
            **kwargs) -> Callable:  # fmt: skip
    """A builder of transformers' backbone ``model`` from its ``config`` with a 5-class linear
    probe (`_LinearProbe`) on its ``dim``-wide (default hidden_size) embedding ``pool``."""

    def build() -> nn.Module:
        import transformers

        backbone = getattr(transformers, model)(getattr(transformers, config)(**kwargs))
        return _LinearProbe(backbone, dim or kwargs["hidden_size"], pool=pool)

    return build


def _mean_of_grid(output) -> torch.Tensor:
    """(B, C) the mean of SAM2's image-encoder features (B, h, w, C)."""
    return output.last_hidden_state.mean((1, 2))


def _sam() -> nn.Module:
    """SAM (Kirillov et al. 2023, "Segment Anything") at 64 px with one point prompt held
    fixed (`vizkit.models.prompted_masks`), its config `small_sam_config`."""
    import transformers

    from .prompted import prompted_masks

    return prompted_masks(transformers.SamModel(small_sam_config()), points=[[20, 30]])


def small_sam_config(window: int = 4, attn: str = "sdpa") -> object:
    """A ``transformers.SamConfig`` at 64 px: an 8 x 8 patch grid of width 32, three blocks
    (the middle one global, the others in ``window`` x ``window`` windows), its neck, prompt
    encoder and two-way mask decoder of width 32 (mask logits (B, 1, M, 32, 32)); attention
    implemented by ``attn``."""
    import transformers

    vision = transformers.SamVisionConfig(
        hidden_size=32, output_channels=32, num_hidden_layers=3, num_attention_heads=2,
        image_size=64, patch_size=8, window_size=window, global_attn_indexes=[1], mlp_dim=64,
        num_pos_feats=16, initializer_range=0.02,
    )  # fmt: skip
    return transformers.SamConfig(
        vision_config=vision,
        prompt_encoder_config=transformers.SamPromptEncoderConfig(
            hidden_size=32, image_size=64, patch_size=8),
        mask_decoder_config=transformers.SamMaskDecoderConfig(
            hidden_size=32, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32),
        attn_implementation=attn,
    )  # fmt: skip


def _siglip2() -> nn.Module:
    """SigLIP 2 takes patches: `vizkit.models.Siglip2Images` gives it images."""
    import transformers

    from . import Siglip2Images

    vision = {k: v for k, v in _HF_SMALL.items() if k != "image_size"}
    config = transformers.Siglip2Config(vision_config={**vision, "num_patches": 16}, num_labels=5)
    return Siglip2Images(transformers.Siglip2ForImageClassification(config))


def _torchvision(name: str, **kwargs) -> Callable:
    def build() -> nn.Module:
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=5, **kwargs)
        head = getattr(getattr(model, "heads", None), "head", None)
        if head is not None:  # torchvision starts the ViT head at zero: no gradient would flow
            torch.nn.init.normal_(head.weight, std=0.02)
        return model

    return build


def _open_clip_zero_shot() -> nn.Module:
    """An open_clip CLIP as a classifier over three random prompts (`vk.models.zero_shot`)."""
    import open_clip

    from .zero_shot import zero_shot

    clip = open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    ).eval()
    prompts = torch.randint(0, 100, (3, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return zero_shot(clip, clip.encode_text(prompts))


# library -> model label -> its small representative (the families of vizkit/families/<library>)
LIBRARIES: dict[str, dict[str, LibraryModel]] = {
    "transformers": {
        "ViTForImageClassification": LibraryModel(
            _transformers("ViTForImageClassification", "ViTConfig", **_HF_SMALL)
        ),
        "DeiTForImageClassificationWithTeacher": LibraryModel(
            _transformers("DeiTForImageClassificationWithTeacher", "DeiTConfig", **_HF_SMALL)
        ),
        "Dinov2ForImageClassification": LibraryModel(
            _transformers("Dinov2ForImageClassification", "Dinov2Config", **_HF_SMALL)
        ),
        "Dinov2WithRegistersForImageClassification": LibraryModel(
            _transformers(
                "Dinov2WithRegistersForImageClassification",
                "Dinov2WithRegistersConfig",
                num_register_tokens=4,
                **_HF_SMALL,
            )
        ),  # fmt: skip
        "DINOv3ViTModel + linear probe": LibraryModel(
            _probed("DINOv3ViTModel", "DINOv3ViTConfig", num_register_tokens=4, **_HF_SMALL)
        ),
        "Aimv2VisionModel + linear probe": LibraryModel(
            _probed("Aimv2VisionModel", "Aimv2VisionConfig", **_HF_SMALL)
        ),
        "HieraForImageClassification": LibraryModel(
            _transformers(
                "HieraForImageClassification",
                "HieraConfig",
                image_size=[64, 64],
                embed_dim=16,
                depths=[1, 1, 1, 1],
                num_heads=[1, 1, 1, 1],
            ),
            size=64,
        ),  # fmt: skip
        "Sam2HieraDetModel + linear probe": LibraryModel(
            _probed(
                "Sam2HieraDetModel",
                "Sam2HieraDetConfig",
                dim=64,
                pool=_mean_of_grid,
                hidden_size=8,
                embed_dim_per_stage=[8, 16, 32, 64],
                blocks_per_stage=[1, 2, 2, 2],
                num_attention_heads_per_stage=[1, 2, 2, 2],
                global_attention_blocks=[4],
                window_size_per_stage=[8, 4, 4, 2],
                image_size=[64, 64],
                attn_implementation="eager",
            ),
            size=64,
        ),  # fmt: skip
        "SamModel (prompted_masks)": LibraryModel(_sam, size=64),
        "CLIPForImageClassification": LibraryModel(
            _transformers("CLIPForImageClassification", "CLIPConfig", "vision_config", **_HF_SMALL)
        ),
        "SwinForImageClassification": LibraryModel(
            _transformers("SwinForImageClassification", "SwinConfig", **_HF_SWIN)
        ),
        "Swinv2ForImageClassification": LibraryModel(  # transformers has no sdpa for Swin V2
            _transformers(
                "Swinv2ForImageClassification",
                "Swinv2Config",
                attn_implementation="eager",
                **_HF_SWIN,
            )
        ),  # fmt: skip
        "BeitForImageClassification": LibraryModel(
            _transformers(
                "BeitForImageClassification",
                "BeitConfig",
                use_relative_position_bias=True,
                **_HF_SMALL,
            )
        ),  # fmt: skip
        "Data2VecVisionForImageClassification": LibraryModel(
            _transformers(
                "Data2VecVisionForImageClassification",
                "Data2VecVisionConfig",
                use_relative_position_bias=True,
                **_HF_SMALL,
            )
        ),  # fmt: skip
        "Siglip2ForImageClassification (Siglip2Images)": LibraryModel(_siglip2),
        "SiglipForImageClassification": LibraryModel(
            _transformers(
                "SiglipForImageClassification", "SiglipConfig", "vision_config", **_HF_SMALL
            )
        ),
        "DPTForSemanticSegmentation": LibraryModel(
            _transformers(
                "DPTForSemanticSegmentation",
                "DPTConfig",
                num_hidden_layers=4,
                backbone_out_indices=[0, 1, 2, 3],
                neck_hidden_sizes=[8, 16, 32, 32],
                fusion_hidden_size=16,
                **{k: v for k, v in _HF_SMALL.items() if k != "num_hidden_layers"},
            )
        ),  # fmt: skip
        "SegformerForSemanticSegmentation": LibraryModel(
            _transformers(
                "SegformerForSemanticSegmentation",
                "SegformerConfig",
                depths=[1, 1, 1, 1],
                sr_ratios=[4, 2, 2, 1],
                hidden_sizes=[8, 16, 16, 32],
                num_attention_heads=[1, 2, 2, 2],
                mlp_ratios=[2, 2, 2, 2],
                decoder_hidden_size=16,
            ),
            size=64,
        ),  # fmt: skip
        "TimesformerForVideoClassification": LibraryModel(
            _transformers(
                "TimesformerForVideoClassification",
                "TimesformerConfig",
                num_frames=4,
                **_HF_SMALL,
            )
        ),  # fmt: skip
        "VideoMAEForVideoClassification": LibraryModel(
            _transformers(
                "VideoMAEForVideoClassification",
                "VideoMAEConfig",
                num_frames=4,
                tubelet_size=2,
                **_HF_SMALL,
            )
        ),  # fmt: skip
        "VJEPA2ForVideoClassification": LibraryModel(
            _transformers(
                "VJEPA2ForVideoClassification",
                "VJEPA2Config",
                crop_size=32,
                patch_size=8,
                frames_per_clip=4,
                tubelet_size=2,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                mlp_ratio=2,
                pred_hidden_size=32,
                pred_num_hidden_layers=1,
                pred_num_attention_heads=2,
                num_pooler_layers=1,
            )
        ),  # fmt: skip
        "VivitForVideoClassification": LibraryModel(
            _transformers(
                "VivitForVideoClassification",
                "VivitConfig",
                num_frames=4,
                tubelet_size=[2, 8, 8],
                **{k: v for k, v in _HF_SMALL.items() if k != "patch_size"},
            )
        ),  # fmt: skip
    },
    "torchvision": {
        "VisionTransformer (vit_b_16)": LibraryModel(
            _torchvision(
                "VisionTransformer",
                image_size=32,
                patch_size=8,
                num_layers=2,
                num_heads=2,
                hidden_dim=32,
                mlp_dim=64,
            )
        ),  # fmt: skip
        "SwinTransformer (swin_t)": LibraryModel(
            _torchvision(
                "SwinTransformer",
                patch_size=[4, 4],
                embed_dim=16,
                depths=[2, 2],
                num_heads=[2, 2],
                window_size=[4, 4],
            )
        ),  # fmt: skip
        "MaxVit (maxvit_t)": LibraryModel(
            _torchvision(
                "MaxVit",
                input_size=(32, 32),
                stem_channels=8,
                partition_size=2,
                block_channels=[16, 32],
                block_layers=[1, 1],
                head_dim=8,
                stochastic_depth_prob=0.0,
            )
        ),  # fmt: skip
    },
    "open_clip": {"CLIP visual tower (zero-shot)": LibraryModel(_open_clip_zero_shot)},
}


def timm_families() -> list[str]:
    """Every model module timm registers models from (its families and vizkit's), sorted."""
    return sorted(_registry.list_modules())
