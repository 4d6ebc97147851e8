"""ELM / GMM attention masks ("RetNet Viewed through Convolution", Li and Zhang 2023, § 3-5): the
mask's equations, its limits against vanilla attention, the released code's float32 underflow,
parameter counts against the paper's tables, the registered variants' model contract and the
mask analyses (radial profile, locality, receptive field, Gaussian fit)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer

import vizkit as vk
from vizkit.papers.masks import ELMAttention, GaussianMixtureMask, GMMAttention, MaskedAttention
from vizkit.papers.masks.analysis import (
    fit_gaussian_mixture,
    gmm_parameters,
    learned_masks,
    mask_locality,
    mask_receptive_field,
    radial_profile,
)
from vizkit.papers.masks.attention_masks import grid_square_distances
from vizkit.papers.masks.masked_vit import MASKS, PAPER_CONFIGS, PAPER_COUNTS, masked_vit_params

VARIANTS = [f"vizkit_{p}_vit_{c}" for p in ("gap", "elm", "gmm") for c in PAPER_CONFIGS]


def gmm(alpha, sigma, **kwargs) -> GaussianMixtureMask:
    """A head-shared GMM with the given (K,) alphas and sigmas, float64."""
    alpha, sigma = torch.as_tensor(alpha, dtype=torch.float64), torch.as_tensor(sigma)
    mask = GaussianMixtureMask(1, len(alpha), share_heads=True, **kwargs).double()
    with torch.no_grad():
        mask.alpha.copy_(alpha[:, None])
        mask.sigma.copy_(sigma[:, None].double())
    return mask


def tokens(b=2, n=64, c=32, seed=0):
    return torch.randn(b, n, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def vanilla_twin(layer: MaskedAttention) -> Attention:
    """timm's Attention with the same qkv and projection weights."""
    twin = Attention(layer.proj.in_features, layer.num_heads, qkv_bias=False).double()
    twin.load_state_dict({k: v for k, v in layer.state_dict().items() if k.split(".")[0] in
                          ("qkv", "proj")})  # fmt: skip
    return twin


def capture(layer: MaskedAttention, x) -> dict:
    """The layer's HookPoint outputs for input tokens x (HookedModel wants images)."""
    found, handles = {}, []
    for name in ("hook_scores", "hook_mask", "hook_scores_masked", "hook_pattern"):
        hook = lambda _m, _i, out, name=name: found.__setitem__(name, out)  # noqa: E731
        handles.append(getattr(layer, name).register_forward_hook(hook))
    try:
        layer(x)
    finally:
        for handle in handles:
            handle.remove()
    return found


# --- the mask's equations --------------------------------------------------------------------


def test_gmm_mask_is_equation_1_on_the_patch_offsets():
    alpha, sigma = [0.7, -1.3, 2.0], [0.5, 2.0, 9.0]
    m = gmm(alpha, sigma)((4, 5))[0]
    for i, j in [(0, 0), (0, 19), (7, 13), (18, 2)]:
        dy, dx = i // 5 - j // 5, i % 5 - j % 5
        want = sum(
            a * math.exp(-(dx**2 + dy**2) / (2 * s**2 + 2e-5))
            for a, s in zip(alpha, sigma, strict=True)
        )
        assert m[i, j].item() == pytest.approx(want, rel=1e-12)


def test_gmm_mask_is_symmetric_translation_invariant_and_its_diagonal_is_the_alpha_sum():
    m = gmm([0.6, -0.8, 1.5], [2.0, 0.2, 5.0])((6, 6))[0]
    assert torch.equal(m, m.T)
    assert torch.allclose(m.diagonal(), torch.full((36,), 1.3, dtype=torch.float64))
    assert torch.allclose(m[7, 8], m[8, 9]) and torch.allclose(m[7, 13], m[8, 14])
    assert torch.allclose(m[0, 1], m[0, 6])  # swapping row and column offsets
    assert torch.allclose(gmm([1.0], [-3.0])((6, 6)), gmm([1.0], [3.0])((6, 6)))


def test_kernel_windows_unfold_to_the_mask():
    """Fig. 1: row i of M is the (gh, gw) window of the (2gh-1, 2gw-1) kernel centred on patch
    i (the window slides from the lower right for i = 0 to the upper left for the last patch)."""
    mask = gmm([0.6, -0.8], [2.0, 0.7])
    gh, gw = 5, 7
    kernel, m = mask.kernel((gh, gw))[0], mask((gh, gw))[0]
    assert kernel.shape == (2 * gh - 1, 2 * gw - 1)
    for i in range(gh * gw):
        r, c = divmod(i, gw)
        window = kernel[gh - 1 - r : 2 * gh - 1 - r, gw - 1 - c : 2 * gw - 1 - c]
        assert torch.allclose(m[i], window.flatten(), atol=0, rtol=1e-12)


def test_fig4_hand_fit_values():
    """Fig. 4's fit: alpha (0.6, -0.8), sigma (2, 0.2) at distances 0, 1, sqrt 2, 2, 3."""
    profile = gmm([0.6, -0.8], [2.0, 0.2])((4, 4))[0][0]
    want = {0: -0.2, 1: 0.5294953, 5: 0.4672808, 2: 0.3639189, 3: 0.1947920}
    for j, value in want.items():
        assert profile[j].item() == pytest.approx(value, abs=5e-7)


@pytest.mark.parametrize("sigma, limit", [(1e6, "flat"), (1e-3, "identity")])
def test_sigma_limits(sigma, limit):
    m = gmm([0.4, 0.35], [sigma, sigma])((5, 5))[0]
    want = torch.full_like(m, 0.75) if limit == "flat" else 0.75 * torch.eye(25, dtype=m.dtype)
    assert torch.allclose(m, want, atol=1e-6)


def test_official_construction_equals_equation_1_up_to_8x8_and_underflows_beyond():
    """The authors' released code: exp(-d^2 / 2) ** (1 / (sigma^2 + 1e-5)) is eq. (1) (§ 3.2)
    with eps 2e-5, but its float32 base is exactly 0 for d^2 >= 104: 21,792 of 65,536 entries on
    16 x 16."""
    exact, official = gmm([1.0], [10.0]), gmm([1.0], [10.0], official_underflow=True)
    assert torch.allclose(official((8, 8)), exact((8, 8)), rtol=1e-5)
    assert (exact((8, 8)) > 0).all()
    on_16 = official((16, 16))[0]
    assert (on_16 == 0).sum().item() == 21_792
    assert torch.equal(on_16 == 0, grid_square_distances((16, 16)) >= 104)
    assert exact((16, 16)).min().item() == pytest.approx(math.exp(-450 / 200), rel=1e-6)
    assert (official((9, 9)) == 0).sum().item() == 20


# --- against vanilla attention ---------------------------------------------------------------


def test_zero_elm_mask_gives_exactly_uniform_attention():
    layer = ELMAttention(32, 4, grid=(8, 8)).double()
    pattern = capture(layer, tokens())["hook_pattern"]
    assert torch.equal(pattern, torch.full_like(pattern, 1 / 64))


def test_huge_sigma_gmm_with_unit_alpha_sum_is_vanilla_attention():
    torch.manual_seed(0)
    layer = GMMAttention(32, 4, num_kernels=3).double()
    with torch.no_grad():
        layer.mask.alpha.copy_(torch.tensor([[1.3] * 4, [-0.5] * 4, [0.2] * 4]))
        layer.mask.sigma.fill_(1e6)
    x = tokens()
    assert torch.allclose(layer(x), vanilla_twin(layer)(x), atol=1e-9)


def test_huge_sigma_gmm_with_alpha_sum_c_is_temperature_one_over_c():
    layer = GMMAttention(32, 4, num_kernels=1, share_heads=True).double()
    with torch.no_grad():
        layer.mask.alpha.fill_(2.5)
        layer.mask.sigma.fill_(1e6)
    x = tokens()
    seen = capture(layer, x)
    assert torch.allclose(seen["hook_pattern"], (2.5 * seen["hook_scores"]).softmax(-1), atol=1e-9)


def test_hooks_expose_scores_mask_masked_scores_and_pattern():
    layer = GMMAttention(32, 4, num_kernels=2).double()
    cache = capture(layer, tokens())
    assert cache["hook_mask"].shape == (4, 64, 64)
    assert torch.allclose(cache["hook_scores_masked"], cache["hook_scores"] * cache["hook_mask"])
    assert torch.allclose(cache["hook_pattern"], cache["hook_scores_masked"].softmax(-1))


def test_prefix_tokens_are_not_masked():
    layer = GMMAttention(32, 4, num_kernels=2, num_prefix_tokens=1).double()
    cache = capture(layer, tokens(n=65))
    scores, masked = cache["hook_scores"], cache["hook_scores_masked"]
    assert torch.equal(masked[..., 0, :], scores[..., 0, :])
    assert torch.equal(masked[..., :, 0], scores[..., :, 0])
    assert torch.allclose(masked[..., 1:, 1:], scores[..., 1:, 1:] * layer.mask((8, 8)))


def test_gradients_reach_alpha_and_sigma_and_stay_finite_for_tiny_sigma():
    layer = GMMAttention(32, 4, num_kernels=2).double()
    with torch.no_grad():
        layer.mask.sigma[0].fill_(0.0)
    layer(tokens()).square().sum().backward()
    for p in (layer.mask.alpha, layer.mask.sigma):
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_paper_initialisation_statistics():
    torch.manual_seed(0)
    mask = GaussianMixtureMask(num_heads=100, num_kernels=100)
    assert mask.alpha.mean().item() == pytest.approx(0, abs=0.1)
    assert mask.alpha.std().item() == pytest.approx(2, rel=0.05)
    assert mask.sigma.mean().item() == pytest.approx(10, abs=0.5)
    assert mask.sigma.std().item() == pytest.approx(10, rel=0.05)


# --- parameters --------------------------------------------------------------------------------


@pytest.mark.parametrize("share_heads, per_layer", [(True, 2 * 5), (False, 2 * 5 * 4)])
def test_gmm_adds_2k_per_layer_head_shared_or_2kh_per_head(share_heads, per_layer):
    base = masked_vit_params("vizkit_gap_vit_tiny")
    masked = masked_vit_params("vizkit_gmm_vit_tiny", num_kernels=5, share_heads=share_heads)
    assert masked - base == per_layer * PAPER_CONFIGS["tiny"][0]["depth"]


def test_elm_adds_np_squared_per_layer():
    depth = PAPER_CONFIGS["tiny"][0]["depth"]
    assert masked_vit_params("vizkit_elm_vit_tiny") - masked_vit_params("vizkit_gap_vit_tiny") == (
        depth * 64**2
    )


@pytest.mark.parametrize("table, name, kwargs, paper", PAPER_COUNTS)
def test_paper_configurations_have_the_tables_parameter_counts(table, name, kwargs, paper):
    assert masked_vit_params(name, **kwargs) == paper


# --- the registered models ----------------------------------------------------------------------


def test_every_mask_and_configuration_is_registered():
    assert set(VARIANTS) <= set(timm.list_models("vizkit_*_vit_*"))
    assert len(VARIANTS) == len(MASKS) * len(PAPER_CONFIGS)


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_runs_forward_backward_and_has_hook_names(name):
    torch.manual_seed(0)
    shrink = {} if name.endswith("tiny") else {"embed_dim": 24, "depth": 2, "num_heads": 4}
    model = timm.create_model(name, **shrink)
    size = model.pretrained_cfg["input_size"][-1]
    logits = model(torch.randn(2, 3, size, size))
    assert logits.shape == (2, model.num_classes)
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    names = set(vk.HookedModel(model).hook_names())
    assert "blocks.1.attn.hook_pattern" in names
    if "_gap_" not in name:
        leaves = ("hook_scores", "hook_mask", "hook_scores_masked")
        assert {f"blocks.1.attn.{leaf}" for leaf in leaves} <= names


def test_gmm_model_runs_at_another_resolution_and_elm_refuses_clearly():
    gmm_model = timm.create_model("vizkit_gmm_vit_tiny", dynamic_img_size=True).eval()
    hm = vk.HookedModel(gmm_model)
    _, cache = hm.run_with_cache(torch.randn(1, 3, 48, 40), names=["blocks.0.attn.hook_mask"])
    assert cache["blocks.0.attn.hook_mask"].shape == (4, 120, 120)  # 12 x 10 grid
    assert torch.allclose(cache["blocks.0.attn.hook_mask"], gmm_model.blocks[0].attn.mask((12, 10)))
    _, intermediates = gmm_model.forward_intermediates(torch.randn(1, 3, 24, 32))
    assert intermediates[-1].shape[-2:] == (6, 8)
    elm_model = timm.create_model("vizkit_elm_vit_tiny", dynamic_img_size=True)
    with pytest.raises(ValueError, match="learned for a 8 x 8 patch grid"):
        elm_model(torch.randn(1, 3, 48, 48))


class ClassTokenGMM(GMMAttention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, num_prefix_tokens=1, **kwargs)


class ClassTokenELM(ELMAttention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, grid=(8, 8), num_prefix_tokens=1, **kwargs)


@pytest.mark.parametrize("layer", [ClassTokenGMM, ClassTokenELM])
def test_layers_drop_into_a_timm_vit_as_attn_layer(layer):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4,
                              num_classes=10, attn_layer=layer)  # fmt: skip
    assert isinstance(model.blocks[1].attn, layer)
    _, cache = vk.HookedModel(model).run_with_cache(
        torch.randn(2, 3, 32, 32), names=["blocks.1.attn.hook_mask"]
    )
    mask = cache["blocks.1.attn.hook_mask"]
    assert mask.shape[-2:] == (65, 65) and (mask[:, 0] == 1).all() and (mask[:, :, 0] == 1).all()


def test_masked_vit_with_a_class_token_leaves_it_unmasked():
    model = timm.create_model("vizkit_gmm_vit_tiny", class_token=True, global_pool="token")
    _, cache = vk.HookedModel(model).run_with_cache(
        torch.randn(2, 3, 32, 32), names=["blocks.0.attn.hook_mask"]
    )
    mask = cache["blocks.0.attn.hook_mask"]
    assert mask.shape == (4, 65, 65) and (mask[:, 0] == 1).all() and (mask[:, :, 0] == 1).all()
    assert torch.equal(mask[:, 1:, 1:], model.blocks[0].attn.mask((8, 8)).detach())


@pytest.mark.parametrize(
    "build, match",
    [(lambda: timm.create_model("vizkit_gmm_vit_tiny", mask="alibi"), "mask must be one of"),
     (lambda: GaussianMixtureMask(4, num_kernels=0), "num_kernels must be"),
     (lambda: GMMAttention(32, 4, attn_head_dim=16), "keeps head_dim"),
     (lambda: GMMAttention(32, 4, scale_norm=True), "does not support scale_norm"),
     (lambda: GMMAttention(32, 4)(tokens(n=60).float()), "not a square grid")],
)  # fmt: skip
def test_bad_mask_options_fail_clearly(build, match):
    with pytest.raises(ValueError, match=match):
        build()


# --- analyses ---------------------------------------------------------------------------------


def test_learned_masks_and_gmm_parameters_read_every_layer():
    model = timm.create_model("vizkit_gmm_vit_tiny", num_kernels=3)
    masks, params = learned_masks(model), gmm_parameters(model)
    assert list(masks) == [f"blocks.{i}.attn" for i in range(4)]
    assert masks["blocks.2.attn"].shape == (4, 64, 64)
    assert params["blocks.2.attn"]["alpha"].shape == (3, 4)
    assert torch.equal(masks["blocks.2.attn"], model.blocks[2].attn.mask((8, 8)).detach())
    with pytest.raises(ValueError, match="element-wise"):
        gmm_parameters(timm.create_model("vizkit_elm_vit_tiny"))
    with pytest.raises(ValueError, match="no learned attention masks"):
        learned_masks(timm.create_model("vizkit_gap_vit_tiny"))


def test_radial_profile_locality_and_extroversion_of_the_fig4_mask():
    m = gmm([0.6, -0.8], [2.0, 0.2])((8, 8))[0]
    distance, profile = radial_profile(m, (8, 8))
    assert distance[:3].tolist() == pytest.approx([0, 1, math.sqrt(2)])
    assert profile[0].item() == pytest.approx(-0.2) and profile[1].item() == pytest.approx(
        0.5294953
    )
    locality = mask_locality(m, (8, 8))
    assert locality.correlation.item() < -0.8  # values fall with distance
    assert locality.extroversion.item() == pytest.approx(0.5294953 + 0.2)


def test_receptive_field_of_zero_and_local_masks():
    grid = (8, 8)
    distance = grid_square_distances(grid).sqrt()
    uniform = mask_receptive_field(torch.zeros(64, 64), grid)
    assert uniform.item() == pytest.approx(distance.mean().item())
    local = gmm([1.0], [1.0])(grid)[0]
    assert mask_receptive_field(local, grid, logit=10.0) < uniform


def test_gaussian_fit_recovers_the_mixture_that_made_the_mask():
    truth = gmm([-0.8, 0.6], [0.6, 2.5])((8, 8))[0]
    fit = fit_gaussian_mixture(truth, (8, 8), num_kernels=2)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9) and fit.r2_radial == pytest.approx(1.0)
    assert fit.alpha.tolist() == pytest.approx([-0.8, 0.6], abs=1e-4)
    assert fit.sigma.tolist() == pytest.approx([0.6, 2.5], abs=1e-4)
    assert fit_gaussian_mixture(truth, (8, 8), num_kernels=1).r2 < 0.99
    noisy = truth + 0.1 * torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    noisy_fit = fit_gaussian_mixture(noisy, (8, 8), num_kernels=2)
    assert noisy_fit.r2 <= noisy_fit.r2_radial < 0.95


# --- figures ----------------------------------------------------------------------------------


def test_folded_mask_puts_each_query_row_at_its_patch():
    mask = torch.arange(36.0 * 36).reshape(36, 36)
    mosaic = vk.papers.masks.folded_mask(mask, (6, 6))
    assert mosaic.shape == (41, 41)
    r, c = 2, 3
    block = mosaic[r * 7 : r * 7 + 6, c * 7 : c * 7 + 6]
    assert torch.equal(block, mask[r * 6 + c].reshape(6, 6))
    assert torch.isnan(mosaic[6]).all()


def gmm_history(epochs=3, layers=2, k=2, h=4):
    g = torch.Generator().manual_seed(0)
    return [
        {"epoch": e + 1, "masks": {f"blocks.{i}.attn": {
            "alpha": torch.randn(k, h, generator=g).tolist(),
            "sigma": (torch.rand(k, h, generator=g) * 5).tolist()} for i in range(layers)}}
        for e in range(epochs)
    ]  # fmt: skip


def test_gmm_parameter_and_mask_evolution_figures_have_one_slider_step_per_epoch():
    history = gmm_history()
    fig = vk.papers.masks.gmm_parameters_figure(history)
    assert len(fig.layout.sliders[0].steps) == 3 and len(fig.data) == 3 * 2
    assert [t.visible for t in fig.data] == [False] * 4 + [True] * 2
    masks = vk.papers.masks.gmm_masks_over_training(history, (5, 5))
    assert masks["blocks.1.attn"][2].shape == (4, 25, 25)
    alpha, sigma = (
        torch.tensor(history[1]["masks"]["blocks.1.attn"][k]) for k in ("alpha", "sigma")
    )
    want = (alpha[..., None, None] * torch.exp(-grid_square_distances((5, 5)) / (
        2 * sigma[..., None, None] ** 2 + 2e-5))).sum(0)  # fmt: skip
    assert torch.allclose(masks["blocks.1.attn"][2], want, atol=1e-6)
    evolution = vk.papers.masks.mask_evolution_figure(masks["blocks.1.attn"], (5, 5))
    assert len(evolution.data) == 3 * 4 and len(evolution.layout.sliders[0].steps) == 3
    with pytest.raises(ValueError, match="no GMM parameters"):
        vk.papers.masks.gmm_parameters_figure([{"epoch": 1, "test_accuracy": 0.5}])


def test_mask_figures_build():
    model = timm.create_model("vizkit_gmm_vit_tiny", num_kernels=2)
    masks = {k: v[0] for k, v in learned_masks(model).items()}
    assert len(vk.papers.masks.mask_layers_figure(masks, (8, 8)).data) == 2 * 4
    assert len(vk.papers.masks.radial_profiles_figure(masks, (8, 8)).data) == 4
    truth = gmm([-0.8, 0.6], [0.6, 2.5])((8, 8))[0]
    fit = fit_gaussian_mixture(truth, (8, 8))
    assert len(vk.papers.masks.gaussian_fit_figure(truth, fit, (8, 8)).data) == 1 + 2 + 1
    ours = {0: {"mean": 0.5, "std": 0.01, "accuracies": [0.49, 0.51], "seeds": [0, 1]},
            1: {"mean": 0.6, "std": 0.02, "accuracies": [0.58, 0.62], "seeds": [0, 1]}}  # fmt: skip
    assert (
        len(vk.papers.masks.accuracy_vs_kernels_figure(ours, {0: 75.36, 1: 75.54}).data)
        == 1 + 2 + 1
    )
    images = np.zeros((2, 32, 32, 3), dtype=np.uint8)
    fig = vk.papers.masks.received_attention_figure(images, {"a": torch.rand(2, 8, 8)}, count=2)
    assert len(fig.data) == 2 * (1 + 2)


def test_received_attention_and_self_mass_of_an_attention_result():
    torch.manual_seed(0)
    model = timm.create_model("vizkit_elm_vit_tiny").eval()
    with torch.no_grad():
        model.blocks[1].attn.mask.mask.normal_()
    result = vk.attention(model, torch.randn(2, 3, 32, 32))
    p = result.patterns  # (L, B, H, 64, 64), no prefix tokens
    assert torch.allclose(result.received(), p.mean(-2).mean(2).reshape(4, 2, 8, 8))
    assert torch.allclose(result.stats()["self_mass"], p.diagonal(dim1=-2, dim2=-1).mean(-1))
    assert torch.allclose(result.stats()["self_mass"][0], torch.tensor(1 / 64))  # zero ELM mask


def test_history_explorer_summarises_the_masks_tracker():
    history = gmm_history(epochs=2)
    quantities = vk.widgets.history_explorer.tracked_quantities(history)
    labels, values = quantities["masks.mean_abs_alpha"][1]
    assert labels == ["blocks.0.attn", "blocks.1.attn"]
    alpha = torch.tensor(history[1]["masks"]["blocks.1.attn"]["alpha"])
    assert values[1] == pytest.approx(alpha.abs().mean().item())
    explorer = vk.widgets.HistoryExplorer(history)
    explorer.quantity.value = "masks.mean_abs_sigma"
    assert len(explorer.static().data) == 2  # one curve per epoch
    elm = [{"epoch": 1, "masks": {"blocks.0.attn": {"distance": [0, 1], "profile": [0.1, 0.2],
                                                     "extroversion": 0.1}}}]  # fmt: skip
    assert "masks.extroversion" in vk.widgets.history_explorer.tracked_quantities(elm)
