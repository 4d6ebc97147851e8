"""open_clip's vision tower (random-init small CLIP, nothing downloaded): names under
``visual``, maps equal torch's own weights, the output unchanged; and text-prompt targets
(`vk.models.zero_shot`) for open_clip and transformers CLIP models."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import vizkit as vk

open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")

BLOCKS = [f"visual.transformer.resblocks.{i}" for i in range(2)]


def build():
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 32, "layers": 2, "head_width": 16},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    ).eval()
    return model, torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_the_vision_tower_is_named_and_its_maps_equal_torch_own_weights():
    model, x = build()
    hm = vk.HookedModel(model)
    assert hm.family.root == "visual" and hm.family.family == "vit"
    maps = [n for n in hm.hook_names() if n.endswith("hook_pattern")]
    assert maps == [f"{b}.attn.hook_pattern" for b in BLOCKS]  # none in the text tower
    plain = model.encode_image(x)
    names = maps + [f"{b}.ln_1.hook_out" for b in BLOCKS]
    _, cache = vk.HookedModel(model.visual).run_with_cache(
        x, names=[n.removeprefix("visual.") for n in names]
    )
    for block in BLOCKS:
        local = block.removeprefix("visual.")
        h = cache[f"{local}.ln_1.hook_out"]
        attn = model.get_submodule(f"{block}.attn")
        _, expected = attn(h, h, h, need_weights=True, average_attn_weights=False)
        torch.testing.assert_close(cache[f"{local}.attn.hook_pattern"], expected)
    torch.testing.assert_close(model.encode_image(x), plain)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_zero_shot_logits_are_scaled_cosine_similarities_to_the_prompts():
    model, x = build()
    text = model.encode_text(torch.randint(0, 100, (3, 8), generator=torch.Generator()))
    classifier = vk.models.zero_shot(model, text)
    image = F.normalize(model.encode_image(x), dim=-1)
    expected = model.logit_scale.exp() * image @ F.normalize(text, dim=-1).T
    torch.testing.assert_close(classifier(x), expected.detach(), rtol=1e-5, atol=1e-5)
    assert vk.models.zero_shot(model, text, scale=1.0)(x).abs().max() <= 1.0 + 1e-6


def test_a_prompt_explains_the_image_through_every_map():
    model, x = build()
    text = model.encode_text(torch.randint(0, 100, (3, 8), generator=torch.Generator()))
    classifier = vk.models.zero_shot(model, text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert vk.attention(classifier, x).patterns.shape == (2, 4, 2, 17, 17)
        for method in (vk.rollout, vk.class_attention):
            assert method(classifier, x).maps.shape == (4, 4, 4)
        for method in (vk.grad_rollout, vk.gradcam):
            one, other = method(classifier, x, target=0), method(classifier, x, target=2)
            assert one.maps.shape == (4, 4, 4)
            assert not torch.allclose(one.maps, other.maps)  # the prompt changes the map


def test_transformers_clip_model_takes_prompts_too():
    torch.manual_seed(0)
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip
    text_config = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "intermediate_size": 64}  # fmt: skip
    config = transformers.CLIPConfig(
        vision_config=vision, text_config=text_config, projection_dim=16
    )
    model = transformers.CLIPModel(config).eval()
    text = model.get_text_features(input_ids=torch.randint(0, 100, (3, 5)))
    text = text if isinstance(text, torch.Tensor) else text.pooler_output
    classifier = vk.models.zero_shot(model, text)
    assert vk.HookedModel(classifier).family.root == "model.vision_model"
    x = torch.randn(4, 3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert vk.gradcam(classifier, x, target=1).maps.shape == (4, 4, 4)
        assert vk.grad_rollout(classifier, x, target=1).maps.shape == (4, 4, 4)


def test_zero_shot_refuses_what_it_cannot_use():
    model, x = build()
    with pytest.raises(ValueError, match=r"\(K, D\), one row per prompt"):
        vk.models.zero_shot(model, torch.randn(16))
    with pytest.raises(ValueError, match="encode the prompts with the same model"):
        vk.models.zero_shot(model, torch.randn(3, 7))(x)
    with pytest.raises(TypeError, match="no image encoder"):
        vk.models.zero_shot(torch.nn.Linear(2, 2), torch.randn(3, 2))
    with pytest.raises(ValueError, match="scale"):
        vk.models.zero_shot(model, torch.randn(3, 16), scale=0.0)


def test_a_timm_backed_tower_keeps_its_timm_family_and_size_check():
    """open_clip's TimmModel holds a timm ViT: found inside (names under visual.trunk), its
    input size checked by vizkit as for the bare timm model."""
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=16,
        vision_cfg={"timm_model_name": "vit_tiny_patch16_224", "timm_model_pretrained": False,
                    "image_size": 224, "timm_pool": "", "timm_proj": "linear"},
        text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1},
    ).eval()  # fmt: skip
    hm = vk.HookedModel(model)
    assert hm.family.root == "visual.trunk" and hm.family.family == "vit"
    with pytest.raises(ValueError, match="built for 224x224 inputs"):
        vk.attention(model.visual, torch.randn(2, 3, 32, 32))
    x = torch.randn(2, 3, 224, 224)
    result = vk.attention(model.visual, x, layers=[-1])
    assert result.patterns.shape == (1, 2, 3, 197, 197)
    text = model.encode_text(torch.randint(0, 100, (3, 8)))
    assert vk.gradcam(vk.models.zero_shot(model, text), x, target=1).maps.shape == (2, 14, 14)
