"""Hugging Face transformers' ViT and DeiT (random-init small configs, nothing downloaded): maps
equal transformers' own (``output_attentions=True`` under eager attention), gradients at the
maps equal autograd's through those, the hooked output equals the plain one under every
attention implementation, ``_attn_implementation`` is restored after every call, and the
analyses run, on the model itself and inside the user's wrapper."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")

SMALL = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 64, "num_labels": 5}  # fmt: skip
IMPLEMENTATIONS = ("eager", "sdpa")


def build(kind: str, attn_implementation: str = "sdpa") -> nn.Module:
    """A small random-init model of ``kind`` (nothing downloaded)."""
    torch.manual_seed(0)
    small = {k: v for k, v in SMALL.items() if k != "num_labels"}
    configs = {
        "vit": (transformers.ViTConfig, transformers.ViTForImageClassification, SMALL),
        "deit": (
            transformers.DeiTConfig, transformers.DeiTForImageClassificationWithTeacher, SMALL,
        ),
        "dinov2": (transformers.Dinov2Config, transformers.Dinov2ForImageClassification, SMALL),
        "dinov2_registers": (
            transformers.Dinov2WithRegistersConfig, transformers.Dinov2WithRegistersModel,
            {**small, "num_register_tokens": 4},
        ),
        "dinov3": (
            transformers.DINOv3ViTConfig, transformers.DINOv3ViTModel,
            {**small, "num_register_tokens": 4},
        ),
        "clip": (transformers.CLIPVisionConfig, transformers.CLIPVisionModel, small),
        "siglip": (transformers.SiglipVisionConfig, transformers.SiglipVisionModel, small),
        "aimv2": (transformers.Aimv2VisionConfig, transformers.Aimv2VisionModel, small),
    }  # fmt: skip
    config, model, kwargs = configs[kind]
    return model(config(attn_implementation=attn_implementation, **kwargs)).eval()


# prefix tokens, and a target for the models without a classifier (their embedding's sum)
PREFIX = {"vit": 1, "deit": 2, "dinov2": 1, "dinov2_registers": 5, "dinov3": 5, "clip": 1,
          "siglip": 0, "aimv2": 0}  # fmt: skip
KINDS = list(PREFIX)


def target(kind: str):
    if kind in ("clip", "siglip", "aimv2"):
        return lambda out: out.pooler_output.sum(-1)
    if kind in ("dinov2_registers", "dinov3"):
        return lambda out: out.last_hidden_state[:, 0].sum(-1)
    return None


def images(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def implementations(model: nn.Module) -> set[str]:
    return {m.config._attn_implementation for m in model.modules() if hasattr(m, "config")}


def eager_reference(model: nn.Module, x: torch.Tensor):
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "eager"
    return reference(x, output_attentions=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_maps_equal_transformers_own_and_the_output_is_unchanged(kind, implementation):
    model, x = build(kind, implementation), images()
    plain = model(x)
    out, cache = vk.HookedModel(model).run_with_cache(x, names="*layer*.hook_pattern")
    for key in ("logits", "last_hidden_state", "pooler_output"):
        if getattr(plain, key, None) is not None:
            torch.testing.assert_close(getattr(out, key), getattr(plain, key), atol=1e-5, rtol=0)
    assert implementations(model) == {implementation}
    expected = eager_reference(model, x).attentions
    captured = cache.stack("hook_pattern")
    tokens = 16 + PREFIX[kind]
    assert captured.shape == (2, 4, 2, tokens, tokens)
    for got, want in zip(captured, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["vit", "deit", "dinov2", "dinov3"])
def test_gradients_at_the_maps_equal_autograd_through_transformers_maps(kind):
    model, x, classes = build(kind), images(), torch.tensor([0, 1, 2, 3])
    norm = vk.targets.embedding_norm()  # a backbone (DINOv3): its embedding's norm
    target = norm if kind == "dinov3" else classes
    _, cache = vk.HookedModel(model).run_with_cache(
        x, names="*.hook_pattern", grads=True, target=target
    )
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "eager"
    out = reference(x, output_attentions=True)
    logits = getattr(out, "logits", None)
    score = norm(out).sum() if logits is None else logits.gather(1, classes[:, None]).sum()
    expected = torch.autograd.grad(score, out.attentions)
    names = [n for n in cache.keys() if n.endswith("hook_pattern")]
    for name, want in zip(names, expected, strict=True):
        torch.testing.assert_close(cache[f"{name}_grad"], want, atol=1e-6, rtol=1e-4)
    assert not any(p.grad is not None for p in model.parameters())
    assert implementations(model) == {"sdpa"}


def check_a_failing_hook_restores_everything(model: nn.Module, x: torch.Tensor) -> None:
    """A hook that raises inside a capture leaves no hook and the model's sdpa attention."""

    def fail(pattern, *, name):
        raise RuntimeError("boom")

    hm = vk.HookedModel(model)
    with pytest.raises(RuntimeError, match="boom"), hm.hooks(fwd={"*.hook_pattern": fail}):
        hm(x)
    assert implementations(model) == {"sdpa"}
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_failing_hook_restores_the_attention_implementation():
    check_a_failing_hook_restores_everything(build("vit"), images())


def test_the_returned_map_cannot_be_edited():
    """transformers returns the weights after computing the output from them, so an edit
    would change nothing: it is refused, and reading works."""
    model, x = build("vit"), images()
    hm = vk.HookedModel(model)
    with pytest.raises(ValueError, match="beside an output it has already computed"):
        with hm.hooks(fwd={"vit.layers.0.attention.hook_pattern": lambda p, name: p * 0}):
            hm(x)
    assert implementations(model) == {"sdpa"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_analysis_runs_with_the_models_token_layout(kind):
    model, x, prefix = build(kind), images(), PREFIX[kind]
    hm, score = vk.HookedModel(model), target(kind)
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.class_token) == (
        prefix,
        (4, 4),
        prefix > 0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: flat maps
        assert vk.attention(model, x).patterns.shape == (2, 4, 2, 16 + prefix, 16 + prefix)
        assert len(vk.attention(model, x).stats()) > 0
        for method in (vk.rollout, vk.class_attention):
            assert method(model, x).maps.shape == (4, 4, 4), method.__name__
        assert vk.gradcam(model, x, target=score).maps.shape == (4, 4, 4)
        last = "resid_pre" if prefix else "resid_post"  # a class-token head, or pooled tokens
        assert vk.gradcam(model, x, target=score).options["layer"].endswith(f"1.hook_{last}")
        if prefix:
            assert vk.grad_rollout(model, x, target=score).maps.shape == (4, 4, 4)
        else:
            with pytest.raises(ValueError, match="needs self-attention over a class token"):
                vk.grad_rollout(model, x, target=score)
        assert vk.integrated_gradients(model, x, target=score or 1).maps.shape == (4, 32, 32)
        assert vk.cka_matrix(model, x).matrix.shape == (2, 2)
        assert len(vk.residual_ratios(model, x).layers) == 2
        assert vk.token_norms(model, x) is not None and vk.token_pca(model, x) is not None


def test_dinov2_layerscale_is_read_from_its_blocks():
    model = build("dinov2")
    scales = vk.analysis.layerscale(model)
    torch.testing.assert_close(scales.attn[0], model.dinov2.encoder.layer[0].layer_scale1.lambda1)


def test_siglip_pooling_head_map_equals_torch_own_weights():
    """SigLIP's MAP head is torch's nn.MultiheadAttention: its per-head map equals what the
    module returns with need_weights=True, average_attn_weights=False."""
    model, x = build("siglip"), images()
    out, cache = vk.HookedModel(model).run_with_cache(x, names="head.attention.hook_pattern")
    head = model.head
    probe = head.probe.repeat(len(x), 1, 1)
    hidden = out.last_hidden_state
    _, expected = head.attention(
        probe, hidden, hidden, need_weights=True, average_attn_weights=False
    )
    assert cache["head.attention.hook_pattern"].shape == (4, 2, 1, 16)
    torch.testing.assert_close(cache["head.attention.hook_pattern"], expected)
    assert vk.HookedModel(model).tap("head.attention.hook_pattern").kind == "pool"


class Wrapper(nn.Module):
    """A user's module holding the model as a backbone, behind a normalization."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = nn.Sequential(nn.Identity(), backbone)

    def forward(self, x):
        return self.backbone(x).logits


def test_a_model_inside_the_users_wrapper_keeps_its_layout():
    model, x = build("vit"), images()
    wrapped = Wrapper(model).eval()
    hm = vk.HookedModel(wrapped)
    assert hm.family.root == "backbone.1.vit"
    assert "backbone.1.vit.layers.1.attention.hook_pattern" in hm.hook_names()
    ours = vk.attention(wrapped, x).patterns
    torch.testing.assert_close(ours, vk.attention(model, x).patterns)
    assert vk.gradcam(wrapped, x).maps.shape == (4, 4, 4)


def test_siglip2_takes_images_through_siglip2images_and_its_maps_equal_transformers_own():
    """SigLIP 2 takes patches; vk.models.Siglip2Images makes them from images as its image
    processor does (raster order, channels last), so the tokens are a raster grid."""
    torch.manual_seed(0)
    vision = {k: v for k, v in SMALL.items() if k not in ("image_size", "num_labels")}
    config = transformers.Siglip2Config(vision_config={**vision, "num_patches": 16}, num_labels=5)
    model = transformers.Siglip2ForImageClassification(config).eval()
    images_model, x = vk.models.Siglip2Images(model).eval(), images()
    result = vk.attention(images_model, x)
    reference = copy.deepcopy(model.vision_model)
    reference.config._attn_implementation = "eager"
    patches = x.reshape(4, 3, 4, 8, 4, 8).permute(0, 2, 4, 3, 5, 1).reshape(4, 16, 192)
    out = reference(
        pixel_values=patches, pixel_attention_mask=torch.ones(4, 16, dtype=torch.long),
        spatial_shapes=torch.tensor([[4, 4]] * 4), output_attentions=True,
    )  # fmt: skip
    for got, want in zip(result.patterns, out.attentions, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert result.layout.grid == (4, 4) and result.layout.num_prefix_tokens == 0
    assert vk.gradcam(images_model, x, target=1).maps.shape == (4, 4, 4)
    with pytest.raises(ValueError, match="multiples of its patch size 8"):
        images_model(torch.randn(1, 3, 30, 30))
