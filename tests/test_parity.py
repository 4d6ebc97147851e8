"""Hooking is invisible: outputs equal the plain (fused) model's, also with every name tapped."""

import warnings

import torch

import vizkit as vk


def test_call_equals_plain_forward(any_model):
    _, model, x = any_model
    with torch.no_grad():
        assert torch.equal(vk.HookedModel(model)(x), model(x))


def test_caching_everything_keeps_output(any_model):
    _, model, x = any_model
    hm = vk.HookedModel(model)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = model(x)  # fused attention on
        out, cache = hm.run_with_cache(x, names="*")
    diff = (out - plain).abs().max().item()
    assert diff < 1e-5, f"hooked output diverges from the fused forward by {diff}"
    # distilled DeiT's head never runs fc_norm: the one name allowed to stay silent, with a warning
    silent = set(hm.hook_names()) - set(cache)
    assert silent <= {"fc_norm.hook_out"}
    assert bool(silent) == any("did not fire" in str(w.message) for w in caught)


def test_identity_hooks_keep_output(attention_model):
    _, model, x = attention_model
    hm = vk.HookedModel(model)
    with torch.no_grad():
        plain = model(x)
        with hm.hooks(fwd={"*": lambda t, name: t.clone()}):  # every tap replaced by a copy
            out = hm(x)
    assert (out - plain).abs().max().item() < 1e-5


def test_inference_mode(attention_model):
    _, model, x = attention_model
    with torch.inference_mode():
        plain = model(x)
        out, cache = vk.HookedModel(model).run_with_cache(x, names="*attn.hook_pattern")
    assert (out - plain).abs().max() < 1e-5 and len(cache) > 0
