"""Refiner's testable claims that concern code (Refiner, Zhou et al. 2021, § 3.2-3.4, 4.4): the
identities of the refiner against vanilla attention and against the distributed-local-attention
reading, its shapes and hook points, sharing, the paper configurations' parameter counts (Table 10),
the variants' model contract, and the test-time crop ratio (RFC)."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention

import vizkit as vk
from vizkit.papers.refiner import AttentionRefiner, RefinerAttention, refined_vit_params
from vizkit.papers.refiner.analysis import attend_local_values, convolve_maps, refiner_stages
from vizkit.papers.refiner.crop_ratio import crop_ratio_view

TINY_VARIANTS = ["vizkit_refined_vit_tiny", "vizkit_refined_vit_tiny_official"]
PAPER_VARIANTS = ["vizkit_refined_vit_base", "vizkit_refined_vit_s", "vizkit_refined_vit_m",
                  "vizkit_refined_vit_l"]  # fmt: skip
SMALL = {"depth": 4, "embed_dim": 32}


def images(n=2, size=32):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def softmax_maps(b=2, h=4, n=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, n, generator=g, dtype=torch.float64).softmax(-1)


def vanilla_twin(layer: RefinerAttention) -> Attention:
    """timm's Attention with the same qkv and projection weights, unfused."""
    dim = layer.proj.in_features
    twin = Attention(dim, layer.num_heads, qkv_bias=True).to(torch.float64)
    twin.load_state_dict({k: v for k, v in layer.state_dict().items() if k.split(".")[0] in
                          ("qkv", "proj")})  # fmt: skip
    twin.fused_attn = False
    return twin


def test_identity_refiner_equals_vanilla_attention_for_r_1_and_3():
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    for r in (1, 3):
        torch.manual_seed(r)
        layer = RefinerAttention(32, 4, qkv_bias=True, expansion=r, init="identity").double()
        tolerance = 1e-12 if r == 1 else 1e-7  # W_R = 1/3 was rounded to float32 at init
        torch.testing.assert_close(layer(x), vanilla_twin(layer)(x), rtol=0, atol=tolerance)


def test_kernel_1_is_linear_head_mixing():
    refiner = AttentionRefiner(4, expansion=2, kernel_size=1).double()
    a = softmax_maps()
    mixing = refiner.weight_reduce @ torch.diag(refiner.weight[:, 0, 0, 0]) @ refiner.weight_expand
    expected = torch.einsum("oi,binm->bonm", mixing.double(), a)
    torch.testing.assert_close(refiner(a), expected, rtol=0, atol=1e-12)


def test_one_hot_expansion_row_copies_that_head():
    refiner = AttentionRefiner(4, expansion=2).double()
    with torch.no_grad():
        refiner.weight_expand.zero_()
        refiner.weight_expand[5, 2] = 1.0
    a = softmax_maps()
    stages = {}
    refiner.hook_expanded.register_forward_hook(lambda m, i, o: stages.setdefault("e", o))
    refiner(a)
    assert torch.equal(stages["e"][:, 5], a[:, 2])


def test_pre_softmax_expansion_identity_and_its_failure_after_softmax():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 9, 8, generator=g), torch.randn(2, 4, 9, 8, generator=g)
    w = torch.randn(4, generator=g)
    per_head = torch.einsum("h,bhid,bhjd->bij", w, q, k)
    full = (w[None, :, None, None] * q).transpose(1, 2).flatten(2) @ k.transpose(1, 2).flatten(2).mT
    torch.testing.assert_close(per_head, full, rtol=1e-5, atol=1e-5)
    after = torch.einsum("h,bhij->bij", w, (q @ k.mT).softmax(-1))
    assert (after - full.softmax(-1)).abs().max() > 1e-2


@pytest.mark.parametrize("k", [1, 3, 5])
def test_convolving_maps_equals_attending_locally_aggregated_values(k):
    a = softmax_maps(n=13)
    g = torch.Generator().manual_seed(k)
    kernel = torch.randn(k, k, generator=g, dtype=torch.float64)
    values = torch.randn(2, 4, 13, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        convolve_maps(a, kernel) @ values,
        attend_local_values(a, kernel, values),
        rtol=0,
        atol=1e-12,
    )
    if k > 1:  # the boundary terms cancel only under zero padding
        replicate = convolve_maps(a, kernel, padding="replicate") @ values
        assert (replicate - attend_local_values(a, kernel, values)).abs().max() > 1e-3


def test_1d_kernel_along_keys_is_a_true_convolution_of_the_values():
    a = softmax_maps(n=11)
    w = torch.tensor([[0.0, 0.0, 0.0], [0.3, -1.2, 0.7], [0.0, 0.0, 0.0]], dtype=torch.float64)
    values = torch.randn(2, 4, 11, 3, dtype=torch.float64)
    flipped = w[1].flip(0).view(1, 1, 3)  # conv1d is a cross-correlation: flip for convolution
    smoothed = F.conv1d(values.mT.reshape(-1, 1, 11), flipped, padding=1).view(2, 4, 3, 11).mT
    torch.testing.assert_close(convolve_maps(a, w) @ values, a @ smoothed, rtol=0, atol=1e-12)


def test_spatial_constraint_equals_attending_over_grid_convolved_values():
    refiner = AttentionRefiner(2, expansion=1, constraint="spatial", num_prefix_tokens=1).double()
    with torch.no_grad():
        refiner.weight_expand.copy_(torch.eye(2))
        refiner.weight_reduce.copy_(torch.eye(2))
    a = softmax_maps(h=2, n=1 + 16)
    refined = refiner(a)
    torch.testing.assert_close(refined[..., :1], a[..., :1], rtol=0, atol=0)  # prefix keys pass
    values = torch.randn(2, 2, 16, 3, dtype=torch.float64)
    kernels = refiner.weight.flip(-1, -2)  # a true 2-D convolution on the patch grid
    convolved = torch.stack([
        F.conv2d(values[:, h].mT.reshape(6, 1, 4, 4), kernels[h : h + 1], padding=1)
        .reshape(2, 3, 16).mT
        for h in range(2)
    ], dim=1)  # fmt: skip
    torch.testing.assert_close(
        refined[..., 1:] @ values, a[..., 1:] @ convolved, rtol=0, atol=1e-12
    )


def test_paper_refiner_collapses_to_one_full_convolution_and_official_does_not():
    a = softmax_maps()
    paper = AttentionRefiner(4, expansion=3).double()
    collapsed = F.conv2d(a, paper.effective_kernel(), padding=1)
    torch.testing.assert_close(paper(a), collapsed, rtol=0, atol=1e-12)
    official = AttentionRefiner(4, expansion=3, mode="official").double().eval()
    with pytest.raises(ValueError, match="collapses to one convolution only"):
        official.effective_kernel()


def test_token_order_matters_for_k_3_but_not_for_k_1():
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    for k, equivariant in ((1, True), (3, False)):
        torch.manual_seed(0)
        layer = RefinerAttention(16, 2, kernel_size=k).double()
        same = torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-10)
        assert same is equivariant


def test_refined_rows_are_not_renormalized_and_rollout_refuses_them():
    model = timm.create_model("vizkit_refined_vit_tiny", **SMALL).eval()
    result = vk.attention(model, images(), maps="applied")
    stats = result.stats()
    assert stats["row_sum_deviation"].mean() > 1e-2 and stats["negative_mass"].mean() > 1e-2
    softmax_stats = vk.attention(model, images()).stats()
    assert "negative_mass" not in softmax_stats
    with pytest.raises(ValueError, match="not row-stochastic"):
        vk.rollout(model, images())
    assert vk.rollout(model, images(), allow_non_stochastic=True).maps.shape == (2, 8, 8)


def test_stochastic_expansion_keeps_rows_stochastic():
    refiner = AttentionRefiner(4, expansion=2, kernel_size=1).double()
    with torch.no_grad():
        refiner.weight_expand.copy_(torch.rand(8, 4).double().softmax(-1))
    expanded = {}
    refiner.hook_expanded.register_forward_hook(lambda m, i, o: expanded.setdefault("e", o))
    refiner(softmax_maps())
    torch.testing.assert_close(expanded["e"].sum(-1), torch.ones(2, 8, 17, dtype=torch.float64))


def test_stages_have_the_documented_shapes():
    model = timm.create_model("vizkit_refined_vit_tiny", expansion=2, **SMALL).eval()
    stages = refiner_stages(model, images(), layer=1)
    shapes = {k: tuple(v.shape) for k, v in stages.maps.items()}
    assert shapes == {"softmax": (2, 4, 65, 65), "expanded": (2, 8, 65, 65),
                      "local": (2, 8, 65, 65), "refined": (2, 4, 65, 65)}  # fmt: skip
    assert stages.kernels.shape == (8, 3, 3) and stages.expand.shape == (8, 4)
    with pytest.raises(ValueError, match="index 9 does not exist; the model has 4 blocks"):
        refiner_stages(model, images(), layer=9)
    plain = timm.create_model("vit_tiny_patch16_224", img_size=32, num_heads=4, **SMALL).eval()
    with pytest.raises(ValueError, match="Block 3 has no attention refiner; blocks with one: none"):
        refiner_stages(plain, images(), layer="blocks.-1")


def test_sharing_blocks_reuse_the_map_and_have_no_query_key_projection():
    model = timm.create_model("vizkit_refined_vit_tiny_official", **SMALL).eval()
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(images(), names="blocks.*.attn.hook_pattern")
    assert torch.equal(cache["blocks.0.attn.hook_pattern"], cache["blocks.1.attn.hook_pattern"])
    assert not torch.equal(cache["blocks.1.attn.hook_pattern"], cache["blocks.2.attn.hook_pattern"])
    share, compute = model.blocks[1].attn, model.blocks[0].attn
    assert not hasattr(share, "qkv") and share.v.weight.shape == (32, 32)
    assert compute.refiner is None and share.refiner is not None  # as released
    assert all(m.relay is None or m.relay.map is None for m in model.modules()
               if isinstance(m, RefinerAttention))  # fmt: skip
    model.forward_intermediates(images())
    assert all(m.relay is None or m.relay.map is None for m in model.modules()
               if isinstance(m, RefinerAttention))  # fmt: skip
    with pytest.raises(RuntimeError, match="ran before the block"):
        share(torch.randn(1, 65, 32))


def test_official_mode_depends_on_train_or_eval_and_paper_mode_does_not():
    a = softmax_maps().float()
    for mode, differs in (("official", True), ("paper", False)):
        refiner = AttentionRefiner(4, mode=mode)
        train_out = refiner.train()(a)
        eval_out = refiner.eval()(a)
        assert (not torch.allclose(train_out, eval_out)) is differs


def test_official_residual_passes_the_maps_when_the_branch_is_zero():
    refiner = AttentionRefiner(4, mode="official").double().eval()
    with torch.no_grad():
        refiner.norm_reduce.weight.zero_()
    seen = {}
    refiner.norm_adapt.register_forward_pre_hook(lambda m, args: seen.setdefault("in", args[0]))
    a = softmax_maps()
    refiner(a)
    torch.testing.assert_close(seen["in"], a, rtol=0, atol=1e-12)


def test_refiner_overhead_per_block():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(AttentionRefiner(12, expansion=3, kernel_size=3)) == 432 + 324 + 432
    assert count(AttentionRefiner(12, mode="official")) == 1188 + 192


@pytest.mark.parametrize("name", PAPER_VARIANTS)
def test_parameter_counts_match_table_10(name):
    # hand counts: S 25.02M, M 55.02M, L 80.62M (no auxiliary head), Base 86.58M
    result = refined_vit_params(name)
    assert abs(result["diff"]) <= 0.6e6, result


@pytest.mark.parametrize("name", TINY_VARIANTS + PAPER_VARIANTS)
def test_every_variant_runs_forward_backward_and_has_hook_names(name):
    torch.manual_seed(0)
    small = {"img_size": 32, "num_classes": 10, "num_heads": 4} if name in PAPER_VARIANTS else {}
    model = timm.create_model(name, **SMALL, **small)
    logits = model(images())
    assert logits.shape == (2, 10)
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "refiner" in n)
    names = vk.HookedModel(model).hook_names()
    leaves = ("hook_pattern", "hook_pattern_refined", "refiner.hook_expanded", "refiner.hook_local")
    refined = [f"blocks.1.attn.{leaf}" for leaf in leaves]
    assert set(refined) <= set(names)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"kernel_size": 2}, "odd integer"), ({"mode": "released"}, "mode must be one of"),
     ({"expansion": 0}, "expansion must be"), ({"constraint": "diag"}, "constraint must be"),
     ({"mode": "official", "init": "identity"}, "identity")],
)  # fmt: skip
def test_bad_refiner_options_fail_clearly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionRefiner(4, **kwargs)


def test_spatial_constraint_needs_a_square_grid_and_masks_are_refused():
    refiner = AttentionRefiner(4, constraint="spatial", num_prefix_tokens=1)
    with pytest.raises(ValueError, match="square patch grid"):
        refiner(softmax_maps(n=12).float())
    layer = RefinerAttention(16, 2)
    with pytest.raises(ValueError, match="no attention mask"):
        layer(torch.randn(1, 5, 16), attn_mask=torch.zeros(5, 5))


def test_crop_ratio_one_is_the_identity_and_above_one_pads_with_black():
    x = images(size=32)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    assert torch.equal(crop_ratio_view(x, 1.0, mean, std), x)
    padded = crop_ratio_view(x, 1.13, mean, std)  # floor(32 / 1.13) = 28: 2 pixels per side
    for c in range(3):
        black = torch.full((2, 32), -mean[c] / std[c])
        for border in (padded[:, c, 0], padded[:, c, 31], padded[:, c, :, 1], padded[:, c, :, -2]):
            torch.testing.assert_close(border, black)
    assert (padded[:, :, 2:30, 2:30] != padded[:, :, :1, :1]).float().mean() > 0.9  # content
    cropped = crop_ratio_view(x, 0.8, mean, std)  # resize to 40, centre-crop 32
    assert cropped.shape == x.shape
    with pytest.raises(ValueError, match="ratio must be positive"):
        crop_ratio_view(x, 0.0, mean, std)


def test_crop_ratio_accuracy_is_a_fraction_per_ratio():
    model = timm.create_model("vizkit_refined_vit_tiny", **SMALL).eval()
    data = torch.utils.data.TensorDataset(images(8), torch.arange(8) % 10)
    accuracy = vk.papers.refiner.crop_ratio_accuracy(model, data, [0.9, 1.0, 1.1], progress=False)
    assert set(accuracy) == {0.9, 1.0, 1.1} and all(0 <= a <= 1 for a in accuracy.values())
