"""Which analysis works on which timm family: run every analysis on one small representative of
each timm model module and record whether it works or is refused, and why.

`vizkit coverage --out docs/coverage.md` writes the table; ``tests/test_coverage.py`` runs the same
walk and fails when a family regresses or timm gains a module the table does not cover.
"""

from __future__ import annotations

import importlib.util
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import timm
import torch
from timm.models import _registry
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import analysis
from .hooks import HookedModel
from .hooks.layout import covers
from .methods import METHODS

__all__ = [
    "ANALYSES",
    "FAMILIES",
    "LIBRARIES",
    "CoverageRow",
    "LibraryModel",
    "Representative",
    "coverage_markdown",
    "run_coverage",
    "run_library_coverage",
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
        from .targets import embedding_of

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


def _siglip2() -> nn.Module:
    """SigLIP 2 takes patches: `vizkit.models.Siglip2Images` gives it images."""
    import transformers

    from .models import Siglip2Images

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

    from .models import zero_shot

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


def _images(model: nn.Module, size: int, batch: int = 4) -> Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch, 3, size, size, generator=generator)


def _attention(model, x):
    result = analysis.attention(model, x, layers=analysis.stage_layers(model, x.shape[-2:]))
    return f"{len(result.layers)} layers, {tuple(result.patterns.shape[-2:])}"


def _stats(model, x):
    result = analysis.attention(model, x, layers=analysis.stage_layers(model, x.shape[-2:]))
    stats = result.stats()
    if not all(torch.isfinite(v).all() for v in stats.values()):
        raise AssertionError("non-finite attention statistics")
    return f"{len(stats)} statistics"


def _map(fn: Callable) -> Callable:
    """Run a saliency method and check its map covers the image (never a wrong shape)."""

    def run(model, x):
        result = fn(model, x)
        b, h, w = result.maps.shape
        if b != len(x) or not covers(h, w, tuple(x.shape[-2:])):
            raise AssertionError(f"map of shape {tuple(result.maps.shape)} for {tuple(x.shape)}")
        if not torch.isfinite(result.maps).all():
            raise AssertionError("non-finite map")
        return f"{h}x{w}"

    return run


def _cka(model, x):
    result = analysis.cka_matrix(model, x, batch_size=len(x), progress=False)
    if not torch.isfinite(result.matrix).all():
        raise AssertionError("non-finite CKA")
    return f"{len(result.layers_a)} layers"


def _residual_ratios(model, x):
    result = analysis.residual_ratios(model, x)
    return f"{len(result.layers)} blocks"


def _token_norms(model, x):
    result = analysis.token_norms(model, x, layers=-1)
    return f"{result.layout.num_prefix_tokens} prefix + {result.patches.shape[-2:]}"


def _token_pca(model, x):
    result = analysis.token_pca(model, x, components=2)
    if not torch.isfinite(result.projections).all():
        raise AssertionError("non-finite projections")
    return f"{result.fitted} tokens"


def _test_time_register(model, x):
    from .registers import register_effect

    result = register_effect(model, x, {0: [0]}, faithfulness=False)
    if not torch.isfinite(result.register_norms).all():
        raise AssertionError("non-finite register")
    grid = "x".join(map(str, result.attention.shape[-2:]))
    return f"{grid} patches + {result.register_norms.shape[1]} register"


def _explorer(model, x):
    from .widgets import AttentionExplorer

    explorer = AttentionExplorer(model.model, x[:2])
    return f"{explorer.layer.max + 1} layers"


# saliency methods the walk leaves out, for their cost on the wide layers of large CNNs (the
# table would take hours); they read the layer Grad-CAM reads, or the image, and are tested on
# the transformer families in tests/test_cam_methods.py and tests/test_gradcam_and_captum.py
NOT_WALKED = {
    "integrated_gradients": "50 forward and backward passes per image",
    "occlusion": "one forward pass per occluded window",
    "scorecam": "one forward pass per channel of the layer",
    "ablationcam": "one forward pass per channel of the layer",
    "smoothgrad": "16 forward and backward passes per image",
    "gradientshap": "16 forward and backward passes per image",
}


def _saliency_columns() -> dict[str, Callable[[nn.Module, Tensor], str]]:
    """One column per saliency method vizkit registers (`vizkit.methods`; not ones a user
    adds, not the random baseline, not `NOT_WALKED`), each run with its defaults and checked to
    cover the image."""
    return {
        name: _map(lambda m, x, method=method: method(m, x))
        for name, method in METHODS.items()
        if name != "random"
        and name not in NOT_WALKED
        and method.fn.__module__.startswith("vizkit.")
    }


ANALYSES: dict[str, Callable[[nn.Module, Tensor], str]] = {
    "attention": _attention,
    "attention_stats": _stats,
    **_saliency_columns(),
    "cka_matrix": _cka,
    "residual_ratios": _residual_ratios,
    "token_norms": _token_norms,
    "token_pca": _token_pca,
    "test_time_register": _test_time_register,
    "explorer": _explorer,
}


@dataclass
class CoverageRow:
    """One family's results.

    Attributes:
        family: timm model module; model: the representative; cls: its class name.
        maps: attention maps by kind, e.g. {"self": 12, "position": 12}.
        results: analysis -> ("works", detail) | ("refused", reason) | ("error", message).
        seconds: time for the whole row.
        unfired: map names the model lists but does not compute in a forward (should be none).
    """

    family: str
    model: str
    cls: str
    maps: dict[str, int]
    results: dict[str, tuple[str, str]]
    seconds: float
    unfired: list[str] = field(default_factory=list)


def run_coverage(families: list[str] | None = None, progress: bool = True) -> list[CoverageRow]:
    """Run every analysis of `ANALYSES` on each family's representative (random weights, four
    random images, eval mode). A ValueError or TypeError is a refusal; anything else (or a map
    that cannot cover the image) is an error."""
    unknown = sorted(set(families or ()) - set(timm_families()))
    if unknown:
        raise ValueError(f"No timm model module {unknown}; known: {', '.join(timm_families())}.")
    rows = []
    for family in tqdm(families or timm_families(), desc="coverage", disable=not progress):
        rows.append(_run_family(family))
    return rows


def run_library_coverage(
    libraries: list[str] | None = None, progress: bool = True
) -> dict[str, list[CoverageRow]]:
    """`run_coverage` for the representatives of other libraries (`LIBRARIES`), by library;
    a library that is not installed is left out."""
    unknown = sorted(set(libraries or ()) - set(LIBRARIES))
    if unknown:
        raise ValueError(f"No library {unknown}; known: {', '.join(LIBRARIES)}.")
    out = {}
    for library in libraries or LIBRARIES:
        if importlib.util.find_spec(library) is None:
            continue
        models = LIBRARIES[library].items()
        out[library] = [
            _row(label, None, lambda m=model: m.build(), model.size)
            for label, model in tqdm(models, desc=library, disable=not progress)
        ]
    return out


def _run_family(family: str) -> CoverageRow:
    rep = FAMILIES.get(family)
    if rep is None:
        return CoverageRow(family, "", "", {}, {}, 0.0)

    def build() -> nn.Module:
        return timm.create_model(rep.model, pretrained=False, **rep.kwargs)

    return _row(family, rep.model, build, rep.size)


def _row(family: str, label: str | None, build: Callable[[], nn.Module], size: int) -> CoverageRow:
    """Every analysis of `ANALYSES` on the model ``build`` makes (seeded, eval mode);
    ``label``: the representative's name, default the vizkit family that reads it."""
    start = time.perf_counter()
    torch.manual_seed(0)
    model = build().eval()
    hm = HookedModel(model)
    if label is None:
        label = f"{hm.family.family} family" if hm.family is not None else "no family"
    maps: dict[str, int] = {}
    map_names = []
    for name in hm.hook_names():
        kind = hm.tap(name).kind or ("self" if name.endswith(".attn.hook_pattern") else "")
        if kind:  # (vizkit's own layers declare their maps as HookPoints)
            maps[kind] = maps.get(kind, 0) + 1
            map_names.append(name)
    x = _images(model, size)
    results = {}
    for name, run in ANALYSES.items():
        results[name] = _outcome(run, hm, x)
    return CoverageRow(family, label, type(model).__name__, maps, results,
                       time.perf_counter() - start, _unfired(hm, x, map_names))  # fmt: skip


def _unfired(hm: HookedModel, x: Tensor, names: list[str]) -> list[str]:
    """The listed map names that one forward on ``x`` does not compute."""
    fired, listed = set(), set(names)
    if not names:
        return []
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the names that do not fire are the answer
            with hm.hooks(fwd={listed.__contains__: lambda value, *, name: fired.add(name)}):
                hm(x)
    except RuntimeError as error:
        if "did not fire" not in str(error):
            raise
    return [n for n in names if n not in fired]


def _outcome(run: Callable, hm: HookedModel, x: Tensor) -> tuple[str, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "works", run(hm, x)
    except (ValueError, TypeError) as refusal:
        return "refused", _first_sentence(str(refusal))
    except Exception as error:  # noqa: BLE001 - recorded as a failure of the table
        return "error", f"{type(error).__name__}: {_first_sentence(str(error))}"


def _first_sentence(message: str) -> str:
    message = " ".join(message.split())
    end = _SENTENCE_END.search(message)
    return message if end is None else message[: end.start() + 1]


_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\. ")


def coverage_markdown(
    rows: list[CoverageRow], libraries: dict[str, list[CoverageRow]] | None = None
) -> str:
    """The tables as Markdown: for timm, then each other library, one row per family (model),
    ✓ or a numbered refusal per analysis; the refusal reasons listed below, and the totals."""
    reasons: list[str] = []
    lines = _table("family (timm module)", rows, reasons)
    names = list(ANALYSES)
    works = {n: sum(r.results.get(n, ("",))[0] == "works" for r in rows) for n in names}
    errors = sum(s == "error" for r in rows for s, _ in r.results.values())
    adapted = sum(1 for r in rows if set(r.maps) - {"unplaced", "position", "gate"})
    unplaced = sum(1 for r in rows if set(r.maps) == {"unplaced"})
    total = (
        f"{len(rows)} timm model modules; {adapted} with an adapter (named blocks and maps), "
        f"{unplaced} more with maps as captured, {len(rows) - adapted - unplaced} with no "
        "softmax attention map vizkit reads; works per analysis: "
        + ", ".join(f"{n} {c}" for n, c in works.items())
        + f"; errors: {errors}."
    )
    sections = []
    for library, library_rows in (libraries or {}).items():
        counted = sum(r.results.get(n, ("",))[0] == "works" for r in library_rows for n in names)
        sections += [
            f"## {library}",
            "",
            f"{len(library_rows)} model{'s' * (len(library_rows) != 1)}; {counted} of "
            f"{len(library_rows) * len(names)} analyses work.",
            "",
            *_table("model", library_rows, reasons),
            "",
        ]
    notes = [f"{i + 1}. {reason}" for i, reason in enumerate(reasons)]
    return "\n".join(
        [_HEADER, "## timm", "", total, "", *lines, "", *sections, "## Refusals", "", *notes, ""]
    )


def _table(first: str, rows: list[CoverageRow], reasons: list[str]) -> list[str]:
    """One Markdown table; refusal reasons are numbered in ``reasons`` (shared by tables)."""
    names = list(ANALYSES)
    lines = [
        f"| {first} | class | representative | maps | " + " | ".join(names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for row in rows:
        cells = []
        for name in names:
            status, text = row.results.get(name, ("missing", ""))
            text = text.replace(row.cls, "the model") if row.cls else text
            text = "The" + text[3:] if text.startswith("the model") else text
            if status == "works":
                cells.append("✓")
            else:
                key = f"{'ERROR ' if status == 'error' else ''}{text}"
                if key not in reasons:
                    reasons.append(key)
                cells.append(
                    f"{'**error** ' if status == 'error' else ''}✗{reasons.index(key) + 1}"
                )
        kinds = ", ".join(f"{k} {n}" for k, n in row.maps.items()) or "none"
        lines.append(
            f"| {row.family} | {row.cls} | `{row.model}` | {kinds} | " + " | ".join(cells) + " |"
        )
    return lines


_HEADER = """# Coverage: which analysis works on which family

Generated by `vizkit coverage --out docs/coverage.md` (do not edit by hand); checked by
`tests/test_coverage.py`. One small representative per timm model module, then per family of
Hugging Face transformers, torchvision and open_clip (random weights from small configs, four
random images, eval mode; nothing downloaded); ✓ works, ✗n is refused with reason n below (a
ValueError that says why and what to use instead). "maps" counts the named attention maps by
kind (see `vizkit.hooks.taps.PATTERN_KINDS`). Hierarchical models are analysed on their last
stage where an analysis needs one token grid (`vk.attention` by default gives every stage).
Every registered saliency method has a column except those whose cost on the wide layers of
large CNNs would make the walk take hours: integrated gradients (50 forward and backward passes
per image), SmoothGrad and GradientSHAP (16 each), occlusion (one forward per window), Score-CAM
and Ablation-CAM (one forward per channel); they read the image or the layer Grad-CAM reads.
"""
