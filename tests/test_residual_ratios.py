"""Residual-norm ratios (CaiT Fig. 4) against ratios recomputed by hand from the blocks."""

from __future__ import annotations

import pytest
import timm
import torch

import vizkit as vk


def vit(init_values=None, depth=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=depth,
        num_heads=2, num_classes=5, init_values=init_values, **kwargs,
    ).eval()  # fmt: skip


def images(n=3):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def by_hand(model, x):
    """Per block: (x_l, SA branch after LayerScale, x'_l, FFN branch after LayerScale)."""
    with torch.no_grad():
        h = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        out = []
        for blk in model.blocks:
            attn = blk.ls1(blk.attn(blk.norm1(h)))
            mid = h + attn
            mlp = blk.ls2(blk.mlp(blk.norm2(mid)))
            out.append((h, attn, mid, mlp))
            h = mid + mlp
    return out


def ratio(branch, stream, reduction):
    if reduction == "sample_fro":
        return (branch.flatten(1).norm(dim=1) / stream.flatten(1).norm(dim=1)).mean()
    if reduction == "per_token":
        return (branch.norm(dim=-1) / stream.norm(dim=-1)).mean()
    return branch.norm() / stream.norm()


@pytest.mark.parametrize("reduction", ["sample_fro", "per_token", "batch"])
def test_ratios_match_a_hand_computation_on_a_two_block_model(reduction):
    model, x = vit(init_values=0.3), images()
    with torch.no_grad():
        for blk in model.blocks:  # distinct per-channel LayerScale values
            blk.ls1.gamma.uniform_(0.1, 0.9)
            blk.ls2.gamma.uniform_(0.1, 0.9)
    result = vk.residual_ratios(model, x, reduction=reduction)
    assert result.layers == ["blocks.0", "blocks.1"] and result.reduction == reduction
    for i, (h, attn, mid, mlp) in enumerate(by_hand(model, x)):
        blk = model.blocks[i]
        assert result.attn[i].item() == pytest.approx(ratio(attn, h, reduction).item(), rel=1e-5)
        assert result.mlp[i].item() == pytest.approx(ratio(mlp, mid, reduction).item(), rel=1e-5)
        raw_attn = attn / blk.ls1.gamma
        raw_mlp = mlp / blk.ls2.gamma
        assert result.attn_unscaled[i].item() == pytest.approx(
            ratio(raw_attn, h, reduction).item(), rel=1e-5
        )
        assert result.mlp_unscaled[i].item() == pytest.approx(
            ratio(raw_mlp, mid, reduction).item(), rel=1e-5
        )
        assert result.gamma_attn.mean_abs[i].item() == pytest.approx(
            blk.ls1.gamma.abs().mean().item()
        )
        assert result.gamma_mlp.max[i].item() == pytest.approx(blk.ls2.gamma.max().item())
    assert result.has_layerscale == [True, True]


def test_layerscale_at_eps_is_exactly_eps_times_the_unscaled_ratio():
    eps = 1e-5
    result = vk.residual_ratios(vit(init_values=eps, depth=3), images())
    assert torch.allclose(result.attn, eps * result.attn_unscaled, rtol=1e-5, atol=0)
    assert torch.allclose(result.mlp, eps * result.mlp_unscaled, rtol=1e-5, atol=0)
    assert result.gamma_attn.min.tolist() == pytest.approx([eps] * 3)


def test_layerscale_one_equals_the_plain_residual():
    plain, scaled = vit(init_values=None), vit(init_values=1.0)
    scaled.load_state_dict(plain.state_dict(), strict=False)  # same weights; gammas stay 1
    x = images()
    a, b = vk.residual_ratios(plain, x), vk.residual_ratios(scaled, x)
    for field in ("attn", "attn_unscaled", "mlp", "mlp_unscaled", "resid_norm"):
        assert torch.allclose(getattr(a, field), getattr(b, field), rtol=1e-6), field
    assert torch.equal(a.attn, a.attn_unscaled)  # no LayerScale: lambda = 1
    assert a.has_layerscale == [False, False] and a.gamma_attn.mean_abs.tolist() == [1.0, 1.0]


def test_cait_includes_the_class_attention_stage(cait):
    model, x = cait
    result = vk.residual_ratios(model, x)
    assert result.layers == ["blocks.0", "blocks.1", "blocks_token_only.0", "blocks_token_only.1"]
    assert result.stage == ["self-attention"] * 2 + ["class-attention"] * 2
    # the class-attention block by hand: the stream is the class token alone
    with torch.no_grad():
        h = model.pos_drop(model.patch_embed(x) + model.pos_embed)
        h = model.blocks(h)
        cls = model.cls_token.expand(len(x), -1, -1)
        blk = model.blocks_token_only[0]
        attn = blk.gamma_1 * blk.attn(blk.norm1(torch.cat([cls, h], 1)))
    expected = (attn.flatten(1).norm(dim=1) / cls.flatten(1).norm(dim=1)).mean()
    assert result.attn[2].item() == pytest.approx(expected.item(), rel=1e-5)
    assert result.gamma_attn.mean_abs[2].item() == pytest.approx(blk.gamma_1.abs().mean().item())


def test_runs_in_eval_mode_and_restores_training():
    model = vit(init_values=0.5, drop_path_rate=0.5).train()
    x = images()
    first, second = vk.residual_ratios(model, x), vk.residual_ratios(model, x)
    assert torch.equal(first.attn, second.attn)  # DropPath and dropout were off
    assert all(m.training for m in model.modules())
    assert torch.allclose(first.attn, vk.residual_ratios(model.eval(), x).attn)


def test_to_dict_is_plain_json():
    import json

    result = vk.residual_ratios(vit(init_values=0.1), images())
    back = vk.ResidualRatios.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.gamma_attn.mean_abs.tolist() == pytest.approx([0.1, 0.1])
    assert torch.equal(back.attn, result.attn) and back.layers == result.layers
    assert vk.analysis.ratio_uniformity([back]) == vk.analysis.ratio_uniformity([result])


def test_errors_are_clear():
    with pytest.raises(ValueError, match="reduction must be one of"):
        vk.residual_ratios(vit(), images(), reduction="mean")
    torch.manual_seed(0)
    resnet = timm.create_model("resnet10t", num_classes=5)
    with pytest.raises(ValueError, match="transformer blocks with a residual stream"):
        vk.residual_ratios(resnet, images())


def test_every_vit_family_layout_and_cait(attention_model):
    key, model, x = attention_model
    result = vk.residual_ratios(model, x)
    depth = len(model.blocks) + len(getattr(model, "blocks_token_only", ()))
    assert len(result.layers) == depth
    for values in (result.attn, result.mlp, result.attn_unscaled, result.resid_norm):
        assert values.shape == (depth,) and torch.isfinite(values).all() and (values > 0).all()
