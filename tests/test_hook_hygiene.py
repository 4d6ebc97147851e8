"""Nothing outlives a context: hooks, fused_attn flags, training flags, parameter grads."""

import pytest
from conftest import model_state

import vizkit as vk


class Boom(Exception):
    pass


def explode(tensor, *, name):
    raise Boom(name)


def test_construction_attaches_nothing(any_model):
    _, model, _ = any_model
    before = model_state(model)
    vk.HookedModel(model).hook_names()
    assert model_state(model) == before


@pytest.mark.parametrize("training", [False, True])
def test_state_restored_after_success(attention_model, training):
    _, model, x = attention_model
    model.train(training)
    before = model_state(model)
    hm = vk.HookedModel(model)
    hm.run_with_cache(x, names="*attn.hook_pattern")
    hm.run_with_cache(x, names="*hook_resid_post", grads=True, target=0)
    with hm.hooks(fwd={"*attn.hook_pattern": lambda t, name: t}):
        hm(x)
    assert model_state(model) == before


def test_state_restored_after_raising_hook(attention_model):
    _, model, x = attention_model
    before = model_state(model)
    hm = vk.HookedModel(model)
    with pytest.raises(Boom), hm.hooks(fwd={"*attn.hook_pattern": explode}):
        hm(x)
    assert model_state(model) == before


def test_state_restored_after_raising_body_and_nested_contexts(attention_model):
    _, model, x = attention_model
    before = model_state(model)
    hm = vk.HookedModel(model)
    with pytest.raises(Boom), hm.hooks(fwd={"*attn.hook_pattern": lambda t, name: None}):
        hm(x)
        with hm.hooks(fwd={"*hook_resid_pre": lambda t, name: None}):
            hm.run_with_cache(x, names="*hook_mlp_out")
            raise Boom("inner")
    assert model_state(model) == before


def test_state_restored_when_a_hook_changes_mode(attention_model):
    _, model, x = attention_model
    before = model_state(model)
    hm = vk.HookedModel(model)

    def flip(tensor, *, name):
        model.train()

    with hm.hooks(fwd={"*hook_resid_post": flip}):
        hm(x)
    assert model_state(model) == before


def test_state_restored_after_failed_run_with_cache(attention_model):
    _, model, x = attention_model
    before = model_state(model)
    hm = vk.HookedModel(model)
    with pytest.raises(ValueError):
        hm.run_with_cache(x, names="*attn.hook_pattern", grads=True, target=10_000)
    assert model_state(model) == before


def test_only_requested_attention_is_unfused(vit_model):
    _, model, x = vit_model
    seen = {}

    def record_flags(tensor, *, name):
        seen.update({i: b.attn.fused_attn for i, b in enumerate(model.blocks)})

    with vk.HookedModel(model).hooks(fwd={"blocks.0.attn.hook_pattern": record_flags}):
        model(x)
    assert seen[0] is False
    assert all(seen[i] for i in seen if i > 0), "attention modules not asked for were unfused"
    assert all(b.attn.fused_attn for b in model.blocks)
