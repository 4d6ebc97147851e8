"""Transformer attribution (Chefer et al., CVPR 2021) against its equations written out on a
two-block ViT: a hand-written forward keeps each block's map A^b, a plain backward gives
grad A^b, a backward under the LRP rules gives R^b = A^b * its gradient, and Eq. 13-14 give
C = (I + E_h[(grad A^1 * R^1)^+]) (I + E_h[(grad A^2 * R^2)^+]), read on the class token's row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vizkit as vk
from vizkit.methods.relevance_rules import relevance_rules

timm = pytest.importorskip("timm")


def _forward(model, x, maps):
    """timm's ViT forward, written out, each block's attention map appended to ``maps``."""
    tokens = model.patch_embed(x)
    tokens = torch.cat([model.cls_token.expand(len(x), -1, -1), tokens], 1) + model.pos_embed
    for block in model.blocks:
        attn = block.attn
        b, n, c = tokens.shape
        qkv = attn.qkv(block.norm1(tokens)).reshape(b, n, 3, attn.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1) * attn.scale).softmax(-1)
        a.retain_grad()
        maps.append(a)
        mixed = (a @ v).transpose(1, 2).reshape(b, n, c)
        tokens = tokens + attn.proj(mixed)
        tokens = tokens + block.mlp.fc2(F.gelu(block.mlp.fc1(block.norm2(tokens))))
    return model.head(model.norm(tokens)[:, 0])


def _map_gradients(model, x, target, rules):
    maps = []
    images = x.clone().requires_grad_(True)
    if rules:
        with relevance_rules():
            logits = _forward(model, images, maps)
    else:
        logits = _forward(model, images, maps)
    logits.gather(1, torch.tensor(target)[:, None]).sum().backward()
    model.zero_grad(set_to_none=True)
    return [a.detach() for a in maps], [a.grad for a in maps]


def test_transformer_attribution_follows_eq_13_14_on_a_two_block_vit():
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", num_classes=5, img_size=32, patch_size=8, depth=2
    ).eval()
    x, target = torch.randn(2, 3, 32, 32), [1, 3]
    maps, gradients = _map_gradients(model, x, target, rules=False)
    _, lrp_gradients = _map_gradients(model, x, target, rules=True)
    eye = torch.eye(maps[0].shape[-1], dtype=torch.float64)
    joint = eye
    for a, grad, lrp in zip(maps, gradients, lrp_gradients, strict=True):
        relevance = a * lrp  # R^b
        step = eye + (grad * relevance).clamp_min(0).mean(1).double()  # Abar^b, Eq. 13
        joint = step @ joint  # C = Abar^1 ... Abar^B applied to the input first, Eq. 14
    expected = joint[:, 0, 1:].float().reshape(2, 4, 4)
    result = vk.transformer_attribution(model, x, target=target)
    torch.testing.assert_close(result.maps, expected, rtol=1e-4, atol=1e-7)
    assert result.targets.tolist() == target
    assert all(p.grad is None and p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("key", ["torchvision", "transformers"])
def test_transformer_attribution_on_other_libraries_vits(key):
    from vizkit.models.representatives import LIBRARIES

    label = {
        "torchvision": "VisionTransformer (vit_b_16)",
        "transformers": "ViTForImageClassification",
    }
    model = LIBRARIES[key][label[key]].build().eval()
    x = torch.randn(2, 3, 32, 32)
    result = vk.transformer_attribution(model, x, target=1)
    assert result.maps.shape == (2, 4, 4) and torch.isfinite(result.maps).all()
    assert result.maps.abs().sum() > 0


def test_transformer_attribution_refuses_models_without_a_class_token_in_self_attention():
    model = timm.create_model("cait_xxs24_224", img_size=32, depth=2, num_classes=5).eval()
    with pytest.raises(ValueError, match="class token"):
        vk.transformer_attribution(model, torch.randn(1, 3, 32, 32))


def test_torchvision_vit_with_timm_weights_gives_the_same_attribution():
    """torch's MultiheadAttention computes A.V inside one call: its map must take the same
    share of relevance as timm's unfused one, so the same weights give the same maps."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ours = timm.create_model(
        "vit_tiny_patch16_224", num_classes=5, img_size=32, patch_size=8, depth=2
    ).eval()
    theirs = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=192, mlp_dim=768,
        num_classes=5,
    ).eval()  # fmt: skip
    pairs = {
        "conv_proj": ours.patch_embed.proj, "encoder.ln": ours.norm, "heads.head": ours.head,
    }  # fmt: skip
    for i, block in enumerate(ours.blocks):
        layer = f"encoder.layers.encoder_layer_{i}"
        pairs |= {
            f"{layer}.ln_1": block.norm1, f"{layer}.ln_2": block.norm2,
            f"{layer}.mlp.0": block.mlp.fc1, f"{layer}.mlp.3": block.mlp.fc2,
            f"{layer}.self_attention.out_proj": block.attn.proj,
        }  # fmt: skip
        attention = theirs.get_submodule(f"{layer}.self_attention")
        with torch.no_grad():
            attention.in_proj_weight.copy_(block.attn.qkv.weight)
            attention.in_proj_bias.copy_(block.attn.qkv.bias)
    with torch.no_grad():
        for name, source in pairs.items():
            theirs.get_submodule(name).load_state_dict(source.state_dict())
        theirs.class_token.copy_(ours.cls_token)
        theirs.encoder.pos_embedding.copy_(ours.pos_embed)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(theirs(x), ours(x), rtol=1e-4, atol=1e-5)
    for method in (vk.transformer_attribution, vk.attnlrp):
        expected = method(ours, x, target=[1, 3]).maps
        torch.testing.assert_close(
            method(theirs, x, target=[1, 3]).maps, expected, rtol=1e-3, atol=1e-6
        )
