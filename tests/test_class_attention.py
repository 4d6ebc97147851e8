"""Class-attention saliency against a recompute from q and k, and CaiT's Fig. 7 recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import build, hooks_on

import vizkit as vk


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_cait_rows_equal_recompute_from_q_and_k(layer):
    model, x = build("cait")
    result = vk.class_attention(model, x, layer=layer)
    j = layer % len(model.blocks_token_only)
    block = model.blocks_token_only[j]
    _, cache = vk.HookedModel(model).run_with_cache(
        x, names=f"blocks_token_only.{j}.norm1.hook_out"
    )
    xn = cache[f"blocks_token_only.{j}.norm1.hook_out"]  # (B, 1 + Np, C): [class, patches]
    attn = block.attn
    b, n, c = xn.shape
    heads = attn.num_heads
    q = attn.q(xn[:, :1]).reshape(b, 1, heads, c // heads).transpose(1, 2)
    k = attn.k(xn).reshape(b, n, heads, c // heads).transpose(1, 2)
    weights = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)[:, :, 0]  # (B, H, 1 + Np)
    grid = result.layout.grid
    torch.testing.assert_close(result.extras["cls_self"], weights[..., 0])
    torch.testing.assert_close(result.extras["per_head"], weights[..., 1:].unflatten(-1, grid))
    torch.testing.assert_close(result.maps, weights[..., 1:].mean(1).unflatten(-1, grid))
    assert result.options["layer_index"] == j
    assert result.options["layer"] == f"blocks_token_only.{j}.attn.hook_pattern"
    assert hooks_on(model) == []


def test_vit_uses_the_last_blocks_class_row():
    model, x = build("deit_distilled")
    result = vk.class_attention(model, x)
    pattern = vk.attention(model, x, layers=-1).patterns[0]  # (B, H, N, N)
    torch.testing.assert_close(result.extras["per_head"].flatten(-2), pattern[:, :, 0, 2:])
    torch.testing.assert_close(result.extras["cls_self"], pattern[:, :, 0, 0])


def test_no_class_token_is_a_clear_error():
    model, x = build("vit_reg_avg")
    with pytest.raises(ValueError, match="no class token"):
        vk.class_attention(model, x)
    model, x = build("cait")
    with pytest.raises(ValueError, match="2 class-attention layers"):
        vk.class_attention(model, x, layer=2)


def test_modulated_gray_is_the_papers_recipe():
    model, x = build("cait")
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    saliency = vk.class_attention(model, x, layer=0)
    image = vk.papers.cait.modulated_gray(saliency, x, mean, std)
    rgb = (x * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]).clamp(0, 1)
    gray = 0.299 * rgb[:, 0] + 0.587 * rgb[:, 1] + 0.114 * rgb[:, 2]
    up = F.interpolate(saliency.maps[:, None], size=x.shape[-2:], mode="bilinear")[:, 0]
    low = up.flatten(1).min(1).values[:, None, None]
    high = up.flatten(1).max(1).values[:, None, None]
    torch.testing.assert_close(image.maps, gray * (up - low) / (high - low))
    with pytest.raises(ValueError, match="batch the saliency was computed on"):
        vk.papers.cait.modulated_gray(saliency, x[:1], mean, std)


def test_class_attention_is_class_agnostic_so_any_target_scores_it(cait):
    model, x = cait
    assert vk.class_attention(model, x).targets is None
    table = vk.compare_saliency(model, x, methods=("class_attention",), target=[3, 4], steps=4)
    assert not table.mean.isnan().any()  # scored for the given classes, not refused
