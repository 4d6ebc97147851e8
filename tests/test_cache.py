"""ActivationCache: forward order, stack, select, lookup, to()."""

import pytest
import torch

import vizkit as vk


def test_order_is_forward_order(vit_model):
    _, model, x = vit_model
    hm = vk.HookedModel(model)
    names = [
        "hook_final_norm",
        "blocks.1.hook_resid_post",
        "blocks.0.attn.hook_pattern",
        "hook_embed",
        "blocks.0.hook_resid_pre",
    ]
    _, cache = hm.run_with_cache(x, names=names)
    assert list(cache) == [
        "hook_embed",
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_pattern",
        "blocks.1.hook_resid_post",
        "hook_final_norm",
    ]


def test_stack_select_and_negative_lookup(vit_model):
    _, model, x = vit_model
    depth = len(model.blocks)
    _, cache = vk.HookedModel(model).run_with_cache(x, names="blocks.*.attn.hook_pattern")
    stacked = cache.stack("attn.hook_pattern")
    n = cache.layout.num_tokens
    assert stacked.shape == (depth, 2, model.blocks[0].attn.num_heads, n, n)
    for i in range(depth):
        assert torch.equal(stacked[i], cache[f"blocks.{i}.attn.hook_pattern"])
    assert torch.equal(cache["blocks.-1.attn.hook_pattern"], stacked[-1])
    assert list(cache.select("blocks.1.*")) == ["blocks.1.attn.hook_pattern"]
    assert len(cache.select("attn.hook_pattern")) == depth


def test_missing_entries_explain_themselves(vit_model):
    _, model, x = vit_model
    _, cache = vk.HookedModel(model).run_with_cache(x, names="blocks.0.attn.hook_pattern")
    with pytest.raises(KeyError, match="not captured"):
        cache["blocks.0.hook_resid_post"]
    with pytest.raises(KeyError, match="not captured"):
        cache["blocks.0.attn.hook_pattern_grad"]
    with pytest.raises(KeyError, match="No cached name"):
        cache["blocks.0.attn.hook_patern"]


def test_stack_refuses_mixed_shapes(cait):
    model, x = cait
    _, cache = vk.HookedModel(model).run_with_cache(x, names="*attn.hook_pattern")
    with pytest.raises(ValueError, match="different shapes"):
        cache.stack("attn.hook_pattern")
    assert cache.stack("blocks_token_only.*.attn.hook_pattern").shape[-2] == 1


def test_to_device_and_cache_device():
    model = vk.create_model("test_vit").eval()
    x = torch.randn(1, 3, 64, 64)
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(x, names="hook_embed", device="meta")
    assert cache["hook_embed"].device.type == "meta"
    _, cache = hm.run_with_cache(x, names="hook_embed")
    assert cache.to("meta")["hook_embed"].device.type == "meta"
    assert cache["hook_embed"].device.type == "cpu"


def test_cache_is_read_only():
    model = vk.create_model("test_vit").eval()
    _, cache = vk.HookedModel(model).run_with_cache(torch.randn(1, 3, 64, 64), names="hook_embed")
    with pytest.raises(TypeError):
        cache["hook_embed"] = torch.zeros(1)
