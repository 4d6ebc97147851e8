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
    torch.manual_seed(0)
    if kind == "vit":
        config = transformers.ViTConfig(attn_implementation=attn_implementation, **SMALL)
        return transformers.ViTForImageClassification(config).eval()
    config = transformers.DeiTConfig(attn_implementation=attn_implementation, **SMALL)
    return transformers.DeiTForImageClassificationWithTeacher(config).eval()


def images(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def implementations(model: nn.Module) -> set[str]:
    return {m.config._attn_implementation for m in model.modules() if hasattr(m, "config")}


def eager_reference(model: nn.Module, x: torch.Tensor):
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "eager"
    return reference(x, output_attentions=True)


@pytest.mark.parametrize("kind", ["vit", "deit"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_maps_equal_transformers_own_and_the_output_is_unchanged(kind, implementation):
    model, x = build(kind, implementation), images()
    plain = model(x).logits
    out, cache = vk.HookedModel(model).run_with_cache(x, names="*.hook_pattern")
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=1e-5)
    assert implementations(model) == {implementation}
    expected = eager_reference(model, x).attentions
    captured = cache.stack("hook_pattern")
    assert captured.shape == (
        2,
        4,
        2,
        16 + (2 if kind == "deit" else 1),
        16 + (2 if kind == "deit" else 1),
    )
    for got, want in zip(captured, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["vit", "deit"])
def test_gradients_at_the_maps_equal_autograd_through_transformers_maps(kind):
    model, x, target = build(kind), images(), torch.tensor([0, 1, 2, 3])
    _, cache = vk.HookedModel(model).run_with_cache(
        x, names="*.hook_pattern", grads=True, target=target
    )
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "eager"
    out = reference(x, output_attentions=True)
    score = out.logits.gather(1, target[:, None]).sum()
    expected = torch.autograd.grad(score, out.attentions)
    names = [n for n in cache.keys() if n.endswith("hook_pattern")]
    for name, want in zip(names, expected, strict=True):
        torch.testing.assert_close(cache[f"{name}_grad"], want, atol=1e-6, rtol=1e-4)
    assert not any(p.grad is not None for p in model.parameters())
    assert implementations(model) == {"sdpa"}


def test_a_failing_hook_restores_the_attention_implementation():
    model, x = build("vit"), images()

    def fail(pattern, *, name):
        raise RuntimeError("boom")

    hm = vk.HookedModel(model)
    with pytest.raises(RuntimeError, match="boom"), hm.hooks(fwd={"*.hook_pattern": fail}):
        hm(x)
    assert implementations(model) == {"sdpa"}
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_returned_map_cannot_be_edited():
    """transformers returns the weights after computing the output from them, so an edit
    would change nothing: it is refused, and reading works."""
    model, x = build("vit"), images()
    hm = vk.HookedModel(model)
    with pytest.raises(ValueError, match="beside an output it has already computed"):
        with hm.hooks(fwd={"vit.layers.0.attention.hook_pattern": lambda p, name: p * 0}):
            hm(x)
    assert implementations(model) == {"sdpa"}


@pytest.mark.parametrize("kind", ["vit", "deit"])
def test_every_analysis_runs_with_the_models_token_layout(kind):
    model, x = build(kind), images()
    prefix = 2 if kind == "deit" else 1
    hm = vk.HookedModel(model)
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.class_token) == (prefix, (4, 4), True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: flat maps
        assert vk.attention(model, x).patterns.shape == (2, 4, 2, 16 + prefix, 16 + prefix)
        assert len(vk.attention(model, x).stats()) > 0
        for method in (vk.rollout, vk.grad_rollout, vk.class_attention, vk.gradcam):
            assert method(model, x).maps.shape == (4, 4, 4), method.__name__
        assert vk.gradcam(model, x).options["layer"].endswith("layers.1.hook_resid_pre")
        assert vk.integrated_gradients(model, x, target=1).maps.shape == (4, 32, 32)
        assert vk.cka_matrix(model, x).matrix.shape == (2, 2)
        assert vk.residual_ratios(model, x).layers == [f"{kind}.layers.0", f"{kind}.layers.1"]
        assert vk.token_norms(model, x) is not None and vk.token_pca(model, x) is not None


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
