"""Captured activations equal independent computations of the same quantity."""

import copy

import torch
from timm.utils import AttentionExtract

import vizkit as vk

TOL = 1e-5


def _max_diff(a, b):
    return (a - b).abs().max().item()


def _rel_diff(a, b):
    return _max_diff(a, b) / b.abs().max().item()


def _recompute_pattern(attn, normed):
    """softmax(q k^T / sqrt(d)) from a timm Attention's qkv weights and its input (B, N, C)."""
    b, n, _ = normed.shape
    qkv = torch.nn.functional.linear(normed, attn.qkv.weight, attn.qkv.bias)
    q, k, _ = qkv.reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(q), attn.k_norm(k)
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, N, N)


def _attention_extract(model, x, names):
    """timm's AttentionExtract (hook mode) on an unfused copy of the model."""
    unfused = copy.deepcopy(model)
    for m in unfused.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return AttentionExtract(unfused, names=names, method="hook")(x)


def test_vit_patterns_match_recompute_and_timm(vit_model):
    _, model, x = vit_model
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(
            x, names=["blocks.*.attn.hook_pattern", "blocks.*.norm1.hook_out"]
        )
        timm_maps = _attention_extract(model, x, ["blocks.*.attn.attn_drop"])
    assert len(timm_maps) == len(model.blocks)
    for i, blk in enumerate(model.blocks):
        pattern = cache[f"blocks.{i}.attn.hook_pattern"]
        recomputed = _recompute_pattern(blk.attn, cache[f"blocks.{i}.norm1.hook_out"])
        assert _max_diff(pattern, recomputed) < TOL
        assert _max_diff(pattern, timm_maps[f"blocks.{i}.attn.attn_drop"]) < TOL
        assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=TOL)


def test_cait_patterns_match_recompute_and_timm(cait):
    model, x = cait
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(
            x, names=["*attn.hook_pattern*", "*norm1.hook_out"]
        )
        timm_maps = _attention_extract(model, x, ["*attn.attn_drop"])
    for i, blk in enumerate(model.blocks):  # talking heads: S = softmax(P_l L), W = P_w S
        a, h = blk.attn, cache[f"blocks.{i}.norm1.hook_out"]
        b, n, c = h.shape
        q, k, _ = a.qkv(h).reshape(b, n, 3, a.num_heads, c // a.num_heads).permute(2, 0, 3, 1, 4)
        logits = (q * a.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
        mixed = (
            torch.einsum("gh,bhqk->bgqk", a.proj_l.weight, logits) + a.proj_l.bias[:, None, None]
        )
        s = mixed.softmax(-1)
        w = torch.einsum("gh,bhqk->bgqk", a.proj_w.weight, s) + a.proj_w.bias[:, None, None]
        assert _max_diff(cache[f"blocks.{i}.attn.hook_pattern"], s) < TOL
        assert _max_diff(cache[f"blocks.{i}.attn.hook_pattern_mixed"], w) < TOL
        assert (
            _max_diff(
                cache[f"blocks.{i}.attn.hook_pattern_mixed"],
                timm_maps[f"blocks.{i}.attn.attn_drop"],
            )
            < TOL
        )
    for j, blk in enumerate(model.blocks_token_only):  # class attention: the class token's row
        a, u = blk.attn, cache[f"blocks_token_only.{j}.norm1.hook_out"]  # (B, 1 + Np, C)
        b, n, c = u.shape
        q = a.q(u[:, :1]).reshape(b, 1, a.num_heads, c // a.num_heads).transpose(1, 2)
        k = a.k(u).reshape(b, n, a.num_heads, c // a.num_heads).transpose(1, 2)
        expected = ((q * a.scale) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, 1, N)
        pattern = cache[f"blocks_token_only.{j}.attn.hook_pattern"]
        assert pattern.shape == (b, a.num_heads, 1, n)
        assert _max_diff(pattern, expected) < TOL
        assert _max_diff(pattern, timm_maps[f"blocks_token_only.{j}.attn.attn_drop"]) < TOL
        assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=TOL)


def test_resid_post_patches_match_forward_intermediates(attention_model):
    key, model, x = attention_model
    hm = vk.HookedModel(model)
    with torch.no_grad():
        _, cache = hm.run_with_cache(x, names="blocks.*.hook_resid_post")
        intermediates = model.forward_intermediates(
            x, indices=len(model.blocks), output_fmt="NLC", intermediates_only=True
        )
    for i, expected in enumerate(intermediates):
        name = f"blocks.{i}.hook_resid_post"
        _, patches = hm.token_layout(x.shape[-2:], name).split(cache[name])
        assert _max_diff(patches, expected) < TOL, f"{key} block {i}"


def test_embed_and_branches_add_up(attention_model):
    _, model, x = attention_model
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(x, names=["hook_embed", "blocks.*.hook_*"])
    for i in range(len(model.blocks)):
        leaves = ["resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"]
        pre, attn_out, mid, mlp_out, post = (cache[f"blocks.{i}.hook_{leaf}"] for leaf in leaves)
        assert _max_diff(pre + attn_out, mid) < TOL
        assert _max_diff(mid + mlp_out, post) < TOL
    assert (
        cache["hook_embed"].shape[1] == vk.HookedModel(model).token_layout(x.shape[-2:]).num_patches
    )


def test_gradients_match_autograd(attention_model):
    key, model, x = attention_model
    name = "blocks.1.hook_resid_mid" if key != "cait" else "blocks_token_only.0.hook_resid_mid"
    target = [3, 7]
    _, cache = vk.HookedModel(model).run_with_cache(x, names=name, grads=True, target=target)

    captured = {}
    module = model.get_submodule(name.rsplit(".", 1)[0] + ".norm2")
    handle = module.register_forward_pre_hook(lambda m, args: captured.setdefault("t", args[0]))
    try:
        logits = model(x)
    finally:
        handle.remove()
    score = logits[torch.arange(2), torch.tensor(target)].sum()
    (expected,) = torch.autograd.grad(score, captured["t"])
    assert _rel_diff(cache[f"{name}_grad"], expected) < 1e-5
    assert all(p.grad is None for p in model.parameters()), "parameter grads were written"


def test_permuted_pattern_gradient_matches_autograd(cait):
    model, x = cait
    name = "blocks.1.attn.hook_pattern"  # read at proj_w's input, (B, N, N, H) -> (B, H, N, N)
    _, cache = vk.HookedModel(model).run_with_cache(x, names=name, grads=True)
    captured = {}
    proj_w = model.blocks[1].attn.proj_w
    handle = proj_w.register_forward_pre_hook(lambda m, args: captured.setdefault("t", args[0]))
    try:
        logits = model(x)
    finally:
        handle.remove()
    score = logits.gather(1, logits.argmax(-1, keepdim=True)).sum()
    (expected,) = torch.autograd.grad(score, captured["t"])
    assert _rel_diff(cache[f"{name}_grad"], expected.permute(0, 3, 1, 2)) < 1e-5


def test_cnn_capture_survives_in_place_relu():
    torch.manual_seed(0)
    model = vk.create_model("resnet18", num_classes=3).eval()  # act1 is ReLU(inplace=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(
            x, names=["bn1.hook_out", "layer4.hook_out"]
        )
        expected = model.bn1(model.conv1(x))
    assert (cache["bn1.hook_out"] < 0).any(), "captured after the in-place ReLU"
    assert _max_diff(cache["bn1.hook_out"], expected) < TOL
    assert cache["layer4.hook_out"].shape == (2, 512, 1, 1)
