"""torchvision's VisionTransformer (random-init small config): its nn.MultiheadAttention maps
equal what the module returns with need_weights=True, average_attn_weights=False; the hooked
output equals the plain (fast-path) one; gradients at the maps equal autograd's; nothing stays
attached; the analyses run."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import torchvision_vit

import vizkit as vk

torchvision = pytest.importorskip("torchvision")

BLOCKS = [f"encoder.layers.encoder_layer_{i}" for i in range(2)]


def build():
    return torchvision_vit(), torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_maps_equal_torch_own_weights_and_the_output_is_unchanged():
    model, x = build()
    plain = model(x)
    names = [f"{b}.self_attention.hook_pattern" for b in BLOCKS]
    inputs = [f"{b}.ln_1.hook_out" for b in BLOCKS]
    out, cache = vk.HookedModel(model).run_with_cache(x, names=names + inputs)
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=0)
    for block, name, normed in zip(BLOCKS, names, inputs, strict=True):
        attn = model.get_submodule(f"{block}.self_attention")
        h = cache[normed]
        _, expected = attn(h, h, h, need_weights=True, average_attn_weights=False)
        assert cache[name].shape == (4, 2, 17, 17)
        torch.testing.assert_close(cache[name], expected)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_gradients_at_the_maps_equal_autograd_through_torch_own_weights():
    model, x = build()
    names = [f"{b}.self_attention.hook_pattern" for b in BLOCKS]
    _, cache = vk.HookedModel(model).run_with_cache(x, names=names, grads=True, target=2)
    weights = []

    def ask(module, args, kwargs):
        return args, {**kwargs, "need_weights": True, "average_attn_weights": False}

    handles = [
        h
        for b in BLOCKS
        for h in (
            model.get_submodule(f"{b}.self_attention").register_forward_pre_hook(
                ask, with_kwargs=True
            ),
            model.get_submodule(f"{b}.self_attention").register_forward_hook(
                lambda m, a, o: weights.append(o[1])
            ),
        )
    ]
    score = model(x)[:, 2].sum()
    for h in handles:
        h.remove()
    expected = torch.autograd.grad(score, [w._base for w in weights])
    for name, want, w in zip(names, expected, weights, strict=True):
        got = cache[f"{name}_grad"]
        assert got.abs().sum() > 0
        torch.testing.assert_close(got, want.view(w.shape))


def test_analyses_run_and_an_edit_of_the_map_is_refused():
    model, x = build()
    hm = vk.HookedModel(model)
    layout = hm.token_layout((32, 32))
    assert (layout.num_prefix_tokens, layout.grid, layout.class_token) == (1, (4, 4), True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert vk.attention(model, x).patterns.shape == (2, 4, 2, 17, 17)
        for method in (vk.rollout, vk.grad_rollout, vk.class_attention, vk.gradcam):
            assert method(model, x).maps.shape == (4, 4, 4), method.__name__
        assert vk.cka_matrix(model, x).matrix.shape == (2, 2)
        assert len(vk.residual_ratios(model, x).layers) == 2
    name = f"{BLOCKS[0]}.self_attention.hook_pattern"
    with pytest.raises(ValueError, match="beside an output it has already computed"):
        with hm.hooks(fwd={name: lambda p, name: p * 0}):
            hm(x)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
