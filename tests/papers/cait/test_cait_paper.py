"""CaiT's testable claims that concern code (Touvron et al. 2021) and the vizkit variants of
what the paper compares: model contract, residual strategies, late class token, Table 3."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.layers import Attention
from timm.models.cait import ClassAttn

import vizkit as vk
from vizkit.analysis.residual_norms import GammaStats
from vizkit.papers.cait import RESIDUAL_STRATEGIES, ResidualScale, cait_family_table
from vizkit.papers.cait.cait_variants import residual_vit

VARIANTS = timm.list_models("vizkit_vit_*") + timm.list_models("vizkit_cait_*")
SMALL = {"depth": 3, "embed_dim": 32}


def images(n=2):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_runs_forward_backward_and_has_hook_names(name):
    torch.manual_seed(0)
    model = timm.create_model(name, **SMALL)
    logits = model(images())
    assert logits.shape == (2, 10)
    logits.logsumexp(-1).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    hm = vk.HookedModel(model)
    names = hm.hook_names()
    assert "blocks.0.hook_resid_pre" in names and "blocks.2.attn.hook_pattern" in names
    ratios = vk.residual_ratios(model.eval(), images())
    assert len(ratios.layers) == 3 + len(getattr(model, "blocks_token_only", ()))


def test_variants_are_registered_for_every_strategy():
    assert {f"vizkit_vit_tiny_{s}" for s in RESIDUAL_STRATEGIES} <= set(VARIANTS)
    with pytest.raises(ValueError, match="Unknown residual strategy"):
        ResidualScale(8, "batchnorm")


@pytest.mark.parametrize(
    "strategy, shape, value",
    [("rezero", (1,), 0.0), ("skipinit", (1,), 0.0), ("fixup", (1,), 1.0),
     ("layerscale", (32,), 0.1), ("layerscale_zero", (32,), 0.0)],
)  # fmt: skip
def test_strategies_start_where_the_paper_says(strategy, shape, value):
    model = residual_vit(strategy, **SMALL)
    gamma = model.blocks[1].ls2.gamma
    assert gamma.shape == shape and torch.all(gamma == value)
    assert isinstance(model.blocks[0].norm1, torch.nn.Identity) == (strategy == "rezero")


@pytest.mark.parametrize("strategy", ["rezero", "skipinit", "layerscale_zero", "fixup"])
def test_zero_initialised_branches_make_every_block_the_identity(strategy):
    model = residual_vit(strategy, **SMALL).eval()
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(
        images(), names=["blocks.*.hook_resid_pre", "blocks.*.hook_resid_post"]
    )
    for i in range(3):
        assert torch.equal(
            cache[f"blocks.{i}.hook_resid_pre"], cache[f"blocks.{i}.hook_resid_post"]
        )


def test_layerscale_one_equals_the_plain_residual():
    plain = residual_vit("prenorm", **SMALL).eval()
    scaled = residual_vit("layerscale", eps=1.0, **SMALL).eval()
    scaled.load_state_dict(plain.state_dict(), strict=False)  # the gammas stay at 1
    torch.testing.assert_close(scaled(images()), plain(images()))


def test_talking_heads_with_identity_mixing_is_plain_multi_head_attention():
    plain = residual_vit("layerscale", talking=False, **SMALL).eval()
    talking = residual_vit("layerscale", talking=True, **SMALL).eval()
    talking.load_state_dict(plain.state_dict(), strict=False)  # all but the mixing matrices
    with torch.no_grad():
        for blk in talking.blocks:
            for mix in (blk.attn.proj_l, blk.attn.proj_w):
                mix.weight.copy_(torch.eye(len(mix.weight)))
                mix.bias.zero_()
    torch.testing.assert_close(talking(images()), plain(images()), rtol=1e-5, atol=1e-6)


def test_class_attention_is_the_cls_row_of_ordinary_attention():
    torch.manual_seed(0)
    dim, heads = 32, 4
    ca = ClassAttn(dim, heads, qkv_bias=True).eval()
    attn = Attention(dim, heads, qkv_bias=True).eval()
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([ca.q.weight, ca.k.weight, ca.v.weight]))
        attn.qkv.bias.copy_(torch.cat([ca.q.bias, ca.k.bias, ca.v.bias]))
        attn.proj.load_state_dict(ca.proj.state_dict())
    u = torch.randn(2, 1 + 16, dim)  # [CLS, patches]
    torch.testing.assert_close(ca(u), attn(u)[:, :1], rtol=1e-5, atol=1e-6)


def test_patch_tokens_pass_the_class_attention_stage_unchanged_and_without_gradient():
    torch.manual_seed(0)
    model = timm.create_model("vizkit_cait_tiny_ca2", **SMALL).eval()
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(images(), names=["blocks.2.hook_resid_post", "hook_final_norm"])
    patches_after = cache["hook_final_norm"][:, 1:]
    torch.testing.assert_close(patches_after, model.norm(cache["blocks.2.hook_resid_post"]))
    features = model.forward_features(images())
    features[:, 1:].sum().backward()
    stage = [p.grad for p in model.blocks_token_only.parameters()]
    assert all(g is None or torch.count_nonzero(g) == 0 for g in stage)
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0  # the patches do get gradients


def test_late_class_token_joins_at_its_block():
    torch.manual_seed(0)
    model = timm.create_model("vizkit_vit_tiny_late_cls", **SMALL).eval()
    assert model.cls_insert_layer == 1
    hm = vk.HookedModel(model)
    names = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    _, before = hm.run_with_cache(images(), names=names)
    assert before[names[0]].shape[1] == 64 and before[names[1]].shape[1] == 65
    with torch.no_grad():
        model.cls_token.add_(1.0)
    _, after = hm.run_with_cache(images(), names=names)
    assert torch.equal(before[names[0]], after[names[0]])  # block 0 never sees the class token
    assert not torch.equal(before[names[1]], after[names[1]])
    assert vk.attention(model, images(), layers=[1, 2]).layout.num_prefix_tokens == 1
    staged = vk.attention(model, images())  # by default one result per token layout
    assert [s.layout.num_prefix_tokens for s in staged] == [0, 1] and staged[0].layers == [0]
    with pytest.raises(ValueError, match=r"hold different tokens \(layer 0: 0 prefix"):
        vk.attention(model, images(), layers=[0, 1])
    with pytest.raises(ValueError, match="cls_insert_layer must be"):
        timm.create_model("vizkit_vit_tiny_late_cls", depth=3, cls_insert_layer=3)


def test_insertion_at_layer_zero_is_timms_vit():
    torch.manual_seed(0)
    ours = residual_vit("prenorm", cls_insert_layer=0, **SMALL).eval()
    reference = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=4, num_heads=4, mlp_ratio=2.0,
        num_classes=10, no_embed_class=True, qkv_bias=True, **SMALL,
    ).eval()  # fmt: skip
    reference.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(images()), reference(images()))


@pytest.mark.slow
def test_timm_cait_family_matches_table_3():
    rows = cait_family_table()
    assert len(rows) == 10
    for row in rows:
        assert round(row.params_224, 1) == row.paper_params, row.name  # Table 3's rounding
        assert abs(row.flops_diff_percent) < 1.5, row.name


def test_ratio_uniformity_is_the_coefficient_of_variation_over_one_stage():
    attn, mlp = torch.tensor([1.0, 2.0, 3.0, 50.0]), torch.tensor([2.0, 2.0, 2.0, 9.0])
    gammas = GammaStats(torch.ones(4), torch.ones(4), torch.ones(4))
    entry = vk.ResidualRatios(
        layers=["blocks.0", "blocks.1", "blocks.2", "blocks_token_only.0"],
        stage=["self-attention"] * 3 + ["class-attention"],
        attn=attn, attn_unscaled=attn, mlp=mlp, mlp_unscaled=mlp,
        resid_norm=torch.ones(4), resid_mid_norm=torch.ones(4), gamma_attn=gammas,
        gamma_mlp=gammas, has_layerscale=[False] * 4, reduction="sample_fro",
    )  # fmt: skip
    summary = vk.analysis.ratio_uniformity([entry, entry])
    assert summary["attn"]["mean"] == [2.0, 2.0]
    assert summary["attn"]["cv"][0] == pytest.approx((2 / 3) ** 0.5 / 2)
    assert summary["mlp"]["cv"] == [0.0, 0.0]
    class_stage = vk.analysis.ratio_uniformity([entry], stage="class-attention")
    assert class_stage["attn"]["mean"] == [50.0]


def test_cait_figures(cait):
    model, x = cait
    shown = vk.viz.display_images(x, model)
    layers = [vk.class_attention(model, x, layer=j) for j in range(2)]
    heads = layers[0].extras["per_head"].shape[1]
    fig = vk.papers.cait.class_attention_heads(layers, shown, image=1)
    assert sum(t.type == "heatmap" for t in fig.data) == 2 * heads
    per_head = layers[1].extras["per_head"][1, 0]
    expected = (per_head - per_head.min()) / (per_head.max() - per_head.min())
    assert torch.allclose(torch.tensor(fig.data[1 + heads].z), expected, atol=1e-6)
    gray = vk.papers.cait.modulated_gray(layers[0], x, model.pretrained_cfg["mean"],
                                      model.pretrained_cfg["std"])  # fmt: skip
    probabilities = torch.tensor([[0.05] * 8 + [0.6, 0.0], [0.5, 0.3] + [0.025] * 8])
    gallery = vk.papers.cait.fig7_gallery(gray, probabilities, [f"c{k}" for k in range(10)])
    titles = [a.text for a in gallery.layout.annotations]
    assert titles == ["c8 (60%)", "c0 (50%), c1 (30%)"]
    mixing = vk.papers.cait.talking_heads_matrices(vk.papers.cait.talking_heads(model))
    assert torch.allclose(torch.tensor(mixing.data[0].z), model.blocks[0].attn.proj_l.weight)
