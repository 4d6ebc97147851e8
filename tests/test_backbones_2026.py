"""The backbones researchers open first in 2026, beyond the coverage table's representatives:
timm's Perception Encoder (``vit_pe_core_*``, blocks of ``AttentionRope``), AIMv2's pooling
head, ViTMAE (unmasked, unshuffled) and SigLIP 2 without its images wrapper. Their maps equal
the ones the model itself computes, and what cannot run as given is refused with a fix that
runs."""

from __future__ import annotations

import re
import warnings

import pytest
import timm
import torch

import vizkit as vk


def own_maps(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The post-softmax maps each timm attention module feeds its ``attn_drop``, unfused."""
    maps, handles = [], []
    for block in model.blocks:
        block.attn.fused_attn = False
        hook = lambda module, args: maps.append(args[0].detach())  # noqa: E731
        handles.append(block.attn.attn_drop.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
        for block in model.blocks:
            block.attn.fused_attn = True
    return maps


def test_perception_encoder_maps_equal_its_own_softmax_and_analyses_run():
    torch.manual_seed(0)
    model = timm.create_model("vit_pe_core_tiny_patch16_384", img_size=64, depth=2).eval()
    x = torch.randn(2, 3, 64, 64)
    result = vk.attention(model, x)
    expected = own_maps(model, x)
    assert result.patterns.shape == (2, 2, 3, 17, 17)
    for layer, own in enumerate(expected):
        torch.testing.assert_close(result.patterns[layer], own)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: flat maps
        assert vk.rollout(model, x).maps.shape == (2, 4, 4)
        assert vk.legrad(model, x, target=vk.targets.embedding_norm()).maps.shape == (2, 4, 4)
        assert vk.cka_matrix(model, torch.randn(4, 3, 64, 64)).matrix.shape == (2, 2)
        assert len(vk.residual_ratios(model, x).layers) == 2


def test_perception_encoder_content_pattern_is_the_unrotated_softmax():
    torch.manual_seed(0)
    model = timm.create_model("vit_pe_core_tiny_patch16_384", img_size=64, depth=1).eval()
    x = torch.randn(1, 3, 64, 64)
    _, cache = vk.HookedModel(model).run_with_cache(x, names="blocks.0.attn.hook_content_pattern")
    attn, captured = model.blocks[0].attn, {}
    model.blocks[0].norm1.register_forward_hook(lambda m, a, out: captured.update(h=out))
    with torch.no_grad():
        model(x)
        q, k, _ = attn.qkv(captured["h"]).reshape(1, 17, 3, attn.num_heads, -1).permute(
            2, 0, 3, 1, 4)  # fmt: skip
        expected = (attn.q_norm(q) * attn.scale @ attn.k_norm(k).transpose(-2, -1)).softmax(-1)
    torch.testing.assert_close(cache["blocks.0.attn.hook_content_pattern"], expected)


def test_aimv2_pooling_map_reproduces_its_heads_output():
    """The pooling head's map, applied to its values, gives the head's own output."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Aimv2VisionConfig(image_size=32, patch_size=8, hidden_size=32,
                                            num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64)  # fmt: skip
    model, x = transformers.Aimv2VisionModel(config).eval(), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.nn.init.normal_(model.head.cls_token)  # zeros at init: a uniform map
        out, cache = vk.HookedModel(model).run_with_cache(x, names="head.hook_pattern")
        pattern, head = cache["head.hook_pattern"], model.head
        tokens = out.last_hidden_state
        values = head.v_proj(tokens).reshape(2, 16, 2, 16).transpose(1, 2)  # (B, H, N, d)
        pooled = (pattern @ values).transpose(1, 2).reshape(2, 32)
        torch.testing.assert_close(head.output_proj(pooled), out.pooler_output)
    assert pattern.shape == (2, 2, 1, 16)
    assert vk.class_attention(model, x).maps.shape == (2, 4, 4)


def test_vitmae_is_explained_on_every_patch_in_raster_order_and_the_raw_model_refused():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTMAEConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, attn_implementation="eager",
    )  # fmt: skip
    mae, x = transformers.ViTMAEModel(config).eval(), torch.randn(2, 3, 32, 32)
    with pytest.raises(TypeError, match="masks a random 75 %") as info:
        vk.attention(mae, x)
    fix = re.search(r"(vk\.models\.unmasked_mae\(model\))", str(info.value)).group(1)
    result = vk.attention(eval(fix, {"vk": vk, "model": mae}), x)
    assert result.patterns.shape == (2, 2, 2, 17, 17) and result.layout.grid == (4, 4)
    assert mae.config.mask_ratio == 0.75  # restored
    config.mask_ratio = 0.0
    with torch.no_grad():  # transformers' own maps, in raster order
        own = mae(x, noise=torch.arange(16.0).expand(2, -1), output_attentions=True)
    torch.testing.assert_close(result.patterns, torch.stack(own.attentions))
    assert torch.equal(own.ids_restore, torch.arange(16).expand(2, -1))


def test_siglip2_without_its_images_wrapper_is_refused_with_a_fix_that_runs():
    pytest.importorskip("transformers")
    from vizkit.models.representatives import LIBRARIES

    wrapped = LIBRARIES["transformers"]["Siglip2ForImageClassification (Siglip2Images)"].build()
    raw, x = wrapped.model.eval(), torch.randn(2, 3, 32, 32)
    with pytest.raises(TypeError, match="takes its images as patches") as info:
        vk.attention(raw, x)
    fix = re.search(r"(vk\.models\.Siglip2Images\(model\))", str(info.value)).group(1)
    assert vk.attention(eval(fix, {"vk": vk, "model": raw}), x).layout.grid == (4, 4)
