"""hooks(): replacements change the forward exactly as the same edit done by hand."""

import torch

import vizkit as vk


def test_replacing_the_last_residual_is_the_head_on_it(vit_model):
    _, model, x = vit_model
    hm = vk.HookedModel(model)
    torch.manual_seed(0)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names="blocks.-1.hook_resid_post")
        new = torch.randn_like(cache["blocks.-1.hook_resid_post"])
        with hm.hooks(fwd={"blocks.-1.hook_resid_post": lambda t, name: new}):
            out = hm(x)
        expected = model.forward_head(model.norm(new))
    assert (out - expected).abs().max() < 1e-5


def test_identity_attention_gives_projected_values(vit_model):
    _, model, x = vit_model
    hm = vk.HookedModel(model)

    def identity(pattern, *, name):  # every token attends only to itself
        return torch.eye(pattern.shape[-1]).expand_as(pattern).contiguous()

    with torch.no_grad(), hm.hooks(fwd={"blocks.0.attn.hook_pattern": identity}):
        _, cache = hm.run_with_cache(x, names=["blocks.0.norm1.hook_out", "blocks.0.attn.hook_out"])
    attn = model.blocks[0].attn
    h = cache["blocks.0.norm1.hook_out"]
    v = attn.qkv(h).chunk(3, dim=-1)[2]  # (B, N, C) values, heads concatenated
    expected = attn.proj(attn.norm(v))
    assert (cache["blocks.0.attn.hook_out"] - expected).abs().max() < 1e-5


def test_uniform_talking_heads_pattern_replaces_s(cait):
    model, x = cait
    hm = vk.HookedModel(model)

    def uniform(s, *, name):  # (B, H, N, N) canonical layout, mapped back to (B, N, N, H)
        return torch.full_like(s, 1.0 / s.shape[-1])

    with torch.no_grad(), hm.hooks(fwd={"blocks.0.attn.hook_pattern": uniform}):
        _, cache = hm.run_with_cache(x, names="blocks.0.attn.hook_pattern_mixed")
    w = model.blocks[0].attn.proj_w
    n = cache["blocks.0.attn.hook_pattern_mixed"].shape[-1]
    expected = (w.weight.sum(1) / n + w.bias)[None, :, None, None]  # P_w applied to uniform S
    assert (cache["blocks.0.attn.hook_pattern_mixed"] - expected).abs().max() < 1e-6


def test_zeroing_gradient_at_a_late_layer_zeroes_earlier_grads(vit_model):
    _, model, x = vit_model
    hm = vk.HookedModel(model)
    with hm.hooks(bwd={"blocks.-1.hook_resid_pre": lambda g, name: torch.zeros_like(g)}):
        _, cache = hm.run_with_cache(x, names="blocks.0.hook_resid_post", grads=True)
    _, free = hm.run_with_cache(x, names="blocks.0.hook_resid_post", grads=True)
    assert free["blocks.0.hook_resid_post_grad"].abs().sum() > 0
    assert cache["blocks.0.hook_resid_post_grad"].abs().sum() == 0


def test_hook_functions_see_canonical_names_and_shapes(attention_model):
    _, model, x = attention_model
    hm = vk.HookedModel(model)
    seen = {}
    with (
        torch.no_grad(),
        hm.hooks(
            fwd={
                "*attn.hook_pattern": lambda t, name: seen.setdefault(name, tuple(t.shape)) and None
            }
        ),
    ):
        hm(x)
    assert seen and all(shape[-1] == shape[-2] or shape[-2] == 1 for shape in seen.values())
    assert all(name.endswith("attn.hook_pattern") for name in seen)
