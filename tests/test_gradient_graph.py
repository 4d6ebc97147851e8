"""Gradient methods record only what they differentiate: no graph before the earliest requested
activation, nothing saved for parameter gradients, every flag as it was afterwards."""

from __future__ import annotations

import pytest
import torch

import vizkit as vk
from vizkit.hooks import saved_bytes


def test_saved_bytes_counts_each_storage_once():
    x, w = torch.randn(100, requires_grad=True), torch.randn(100)
    assert saved_bytes(lambda: (x * w).sum()) == 400  # w, for the gradient of x
    assert saved_bytes(lambda: (x * x).sum()) == 400  # x, saved twice: one storage
    assert saved_bytes(lambda: (x.exp() * w).sum()) == 800  # exp's output and w


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    model = vk.create_model("vit_tiny_patch16_224", img_size=64, depth=6).eval()
    return model, torch.randn(4, 3, 64, 64)


def tail_bytes(model, x) -> int:
    """What the gradient at the last block's input needs: that block, the norm and the head."""

    def tail() -> None:
        with torch.no_grad():
            h = model.blocks[:-1](model._pos_embed(model.patch_embed(x)))
        h.requires_grad_(True)
        with vk.hooks.frozen_parameters(model):
            out = model.forward_head(model.norm(model.blocks[-1](h)))
            torch.autograd.grad(out[:, 3].sum(), h)

    return saved_bytes(tail)


def plain_input_gradient(model, x) -> None:
    """Plain autograd of class 3's score to the input, parameters requiring grad."""
    x = x.clone().requires_grad_(True)
    torch.autograd.grad(model(x)[:, 3].sum(), x)


def test_gradcam_saves_what_the_tail_needs(vit):
    model, x = vit
    tail = tail_bytes(model, x)
    ours = saved_bytes(lambda: vk.gradcam(model, x, target=3))
    assert ours <= 1.5 * tail, f"Grad-CAM saved {ours / tail:.1f}x the tail's bytes"
    assert saved_bytes(lambda: plain_input_gradient(model, x)) > 4 * ours  # for scale


def test_gradients_cross_residual_branches_beside_the_hooked_module(vit):
    """blocks.1.hook_resid_mid is read at norm2's input; the stream also goes around the MLP.
    The gradient must carry both paths, as plain autograd's does."""
    model, x = vit
    name = "blocks.1.hook_resid_mid"
    _, cache = vk.HookedModel(model).run_with_cache(x, names=name, grads=True, target=3)
    captured = {}
    handle = model.blocks[1].norm2.register_forward_pre_hook(
        lambda m, args: captured.setdefault("t", args[0])
    )
    try:
        score = model(x)[:, 3].sum()
    finally:
        handle.remove()
    (expected,) = torch.autograd.grad(score, captured["t"])
    assert torch.allclose(cache[f"{name}_grad"], expected, rtol=1e-4, atol=1e-7)
    assert all(p.grad is None for p in model.parameters())


def test_flags_are_restored_also_after_an_error(vit):
    model, x = vit
    model.blocks[0].requires_grad_(False)  # a user's partly frozen model
    before = [p.requires_grad for p in model.parameters()]

    def failing_target(logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("target failed")

    try:
        for target in (3, failing_target):
            try:
                vk.HookedModel(model).run_with_cache(
                    x, names="blocks.2.hook_resid_pre", grads=True, target=target
                )
            except RuntimeError as error:
                assert "target failed" in str(error)
            assert [p.requires_grad for p in model.parameters()] == before
            assert torch.is_grad_enabled()
            assert all(p.grad is None for p in model.parameters())
        with torch.no_grad():  # the caller's grad mode is kept too
            vk.gradcam(model, x, target=3)
            assert not torch.is_grad_enabled()
    finally:
        model.blocks[0].requires_grad_(True)


def test_a_value_beside_the_output_has_no_gradient():
    model, _ = vk.zoo.load("sot_sum_s0")
    images, *_ = vk.datasets.load_sample()
    with pytest.raises(RuntimeError, match="does not depend on"):
        vk.HookedModel(model).run_with_cache(
            images[:2], names="head.pool.hook_sv", grads=True, target=0
        )


def test_input_gradient_methods_save_nothing_for_parameters(vit):
    model, x = vit
    ours = saved_bytes(lambda: vk.saliency(model, x, target=3))
    assert ours < saved_bytes(lambda: plain_input_gradient(model, x))
    assert all(p.requires_grad for p in model.parameters())


def test_run_with_cache_refuses_a_cache_above_max_bytes(vit):
    model, x = vit
    hm = vk.HookedModel(model)
    one = 4 * 17 * 192 * 4  # one (B, N, C) float32 activation: B 4, N 1 + 16 patches, C 192
    _, cache = hm.run_with_cache(x, names="blocks.*.hook_resid_post", max_bytes=6 * one)
    assert len(cache) == 6
    with pytest.raises(ValueError, match=r"max_bytes=.* at blocks\.5\.hook_resid_post"):
        hm.run_with_cache(x, names="blocks.*.hook_resid_post", max_bytes=6 * one - 1)
    with pytest.raises(ValueError, match="activations and gradients"):  # a gradient doubles it
        hm.run_with_cache(x, names="blocks.*.hook_resid_post", grads=True, max_bytes=6 * one)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert all(p.requires_grad for p in model.parameters()) and torch.is_grad_enabled()


def test_grad_rollout_refuses_before_running(vit):
    model, x = vit
    calls = []
    handle = model.register_forward_pre_hook(lambda m, args: calls.append(1))
    try:
        with pytest.raises(ValueError, match="differentiates through 6 attention maps"):
            vk.grad_rollout(model, x, max_bytes=50_000)  # the maps, one gradient: 97 kB
    finally:
        handle.remove()
    assert calls == []  # refused from the estimate, nothing computed
    assert vk.grad_rollout(model, x).maps.shape == (4, 4, 4)


def test_gradient_functions_see_what_grads_would_cache(vit):
    model, x = vit
    hm = vk.HookedModel(model)
    names = ["blocks.1.hook_resid_post", "blocks.4.attn.hook_pattern"]
    _, cache = hm.run_with_cache(x, names=names, grads=True, target=3)
    seen = {}
    hm.run_with_cache(
        x,
        names=names[0],
        target=3,
        bwd={n: lambda g, name: seen.setdefault(name, g) for n in names},
    )
    for name in names:
        torch.testing.assert_close(seen[name], cache[f"{name}_grad"])
    assert list(seen) == names[::-1]  # the backward reaches the later activation first
