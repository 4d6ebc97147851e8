"""The decays the masks paper starts from (its § 1 and Fig. 2: RetNet viewed through
convolution), against their equations written out here: RetNet's causal gamma^(n - m), RMT's
Manhattan gamma^(|dx| + |dy|), a local window; each mask's rows are windows of one kernel; with
constant content the masked aggregation is a depthwise convolution with that kernel; in the
masked ViT the mask multiplies the scaled scores before the softmax, as the paper's GMM."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

from vizkit.papers.masks.attention_masks import (
    DecayMask,
    GaussianMixtureMask,
    LocalMask,
    retnet_gammas,
)
from vizkit.papers.masks.masked_vit import DECAY_MASKS, masked_vit_params

GRID = (3, 4)


def _positions(grid):
    return [divmod(i, grid[1]) for i in range(grid[0] * grid[1])]


def test_retnet_decay_is_causal_gamma_to_the_raster_distance():
    """Sun et al. 2023, the parallel form: D_nm = gamma^(n - m) for n >= m, else 0; with
    gamma_h = 1 - 2^(-5-h)."""
    mask = DecayMask(3, "causal")(GRID)
    gammas = retnet_gammas(3)
    assert torch.allclose(gammas, torch.tensor([1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128],
                                               dtype=torch.float64))  # fmt: skip
    for h in range(3):
        for n in range(12):
            for m in range(12):
                expected = float(gammas[h]) ** (n - m) if n >= m else 0.0
                assert mask[h, n, m].item() == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_rmt_decay_is_gamma_to_the_manhattan_distance():
    """Fan et al. 2023, Manhattan self-attention: D_nm = gamma^(|x_n - x_m| + |y_n - y_m|),
    two-sided."""
    gammas = torch.tensor([0.5, 0.9])
    mask = DecayMask(2, "manhattan", gammas)(GRID)
    for h, gamma in enumerate(gammas.tolist()):
        for n, (rn, cn) in enumerate(_positions(GRID)):
            for m, (rm, cm) in enumerate(_positions(GRID)):
                expected = gamma ** (abs(rn - rm) + abs(cn - cm))
                assert mask[h, n, m].item() == pytest.approx(expected, rel=1e-6)


def test_local_mask_is_the_neighbourhood_window():
    mask = LocalMask(1)(GRID)[0]
    for n, (rn, cn) in enumerate(_positions(GRID)):
        for m, (rm, cm) in enumerate(_positions(GRID)):
            assert mask[n, m] == float(abs(rn - rm) <= 1 and abs(cn - cm) <= 1)


MASKS = {
    "retnet": DecayMask(2, "causal", torch.tensor([0.6, 0.8])),
    "rmt": DecayMask(2, "manhattan", torch.tensor([0.6, 0.8]), learnable=True),
    "local": LocalMask(1),
}


def _gmm():
    torch.manual_seed(0)
    return GaussianMixtureMask(2, num_kernels=3)


@pytest.mark.parametrize("name", [*MASKS, "gmm"])
def test_each_row_is_a_window_of_the_kernel(name):
    """Row i of the mask is the (gh, gw) window of the (2gh - 1, 2gw - 1) kernel centred on
    patch i: the kernel is the mask's row at the centre patch, extended."""
    module = MASKS.get(name) or _gmm()
    gh, gw = GRID
    with torch.no_grad():
        mask, kernel = module(GRID), module.kernel(GRID)
    assert kernel.shape[-2:] == (2 * gh - 1, 2 * gw - 1)
    for i, (r, c) in enumerate(_positions(GRID)):
        window = kernel[:, gh - 1 - r : 2 * gh - 1 - r, gw - 1 - c : 2 * gw - 1 - c]
        torch.testing.assert_close(mask[:, i], window.flatten(1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", [*MASKS, "gmm"])
def test_constant_content_aggregation_is_a_depthwise_convolution(name):
    """sum_m M_nm v_m over the patches equals conv2d (cross-correlation, zero padding) of the
    values on the grid with the kernel: the paper's "element-wise convolution"."""
    module = MASKS.get(name) or _gmm()
    gh, gw = GRID
    values = torch.randn(5, gh * gw, generator=torch.Generator().manual_seed(1))  # 5 channels
    with torch.no_grad():
        mask, kernel = module(GRID), module.kernel(GRID)
        for h in range(len(mask)):
            aggregated = values @ mask[h].T  # (5, Np)
            grid_values = values.view(1, 5, gh, gw)
            weight = kernel[h].expand(5, 1, *kernel.shape[-2:])
            convolved = F.conv2d(grid_values, weight, padding=(gh - 1, gw - 1), groups=5)
            torch.testing.assert_close(aggregated, convolved.view(5, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", DECAY_MASKS)
def test_decay_vit_multiplies_the_mask_into_the_scores(mask):
    """In the masked ViT, softmax((Q K^T / sqrt(d)) o M) V with M the decay on the patch block
    (the model has no prefix token), recomputed here from the layer's weights."""
    torch.manual_seed(0)
    model = timm.create_model(f"vizkit_{mask}_vit_tiny", learnable_gamma=True).eval()
    x = torch.randn(2, 3, 32, 32)
    attn = model.blocks[0].attn
    seen = {}
    handle = attn.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    with torch.no_grad():
        model(x)
        handle.remove()
        tokens = seen["x"]
        b, n, c = tokens.shape
        q, k, v = attn.qkv(tokens).view(b, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
        decay = attn.mask((8, 8))  # (Hm, 64, 64)
        pattern = ((q * attn.head_dim**-0.5) @ k.transpose(-2, -1) * decay).softmax(-1)
        expected = attn.proj((pattern @ v).transpose(1, 2).reshape(b, n, c))
        torch.testing.assert_close(attn(tokens), expected, rtol=1e-5, atol=1e-6)
    gammas = [p for name, p in model.named_parameters() if "gamma" in name]
    assert len(gammas) == (0 if mask == "local" else len(model.blocks))
    fixed = timm.create_model(f"vizkit_{mask}_vit_tiny")
    assert not [name for name, _ in fixed.named_parameters() if "gamma" in name]


@pytest.mark.parametrize("mask", DECAY_MASKS)
def test_decay_vits_are_counted_on_the_meta_device(mask):
    """`masked_vit_params` builds on the meta device; a learned gamma costs one parameter per head
    and block (the gammas are checked on the CPU, not read from meta tensors)."""
    for learnable in (False, True):
        built = timm.create_model(f"vizkit_{mask}_vit_tiny", learnable_gamma=learnable)
        counted = masked_vit_params(f"vizkit_{mask}_vit_tiny", learnable_gamma=learnable)
        assert counted == sum(p.numel() for p in built.parameters())
    added = counted - masked_vit_params(f"vizkit_{mask}_vit_tiny")
    heads = built.blocks[0].attn.num_heads
    assert added == (0 if mask == "local" else heads * len(built.blocks))


def test_bad_decay_options_fail_clearly():
    with pytest.raises(ValueError, match="kind"):
        DecayMask(2, "gaussian")
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        DecayMask(2, gammas=torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="radius"):
        LocalMask(-1)


def test_frozen_mask_keeps_its_initialisation_through_training_steps():
    """The frozen-mask control: ``freeze_mask=True`` leaves the GMM's alpha and sigma at their
    initialisation (the same draw as the learned model's under one seed) while the rest
    trains; a mask without parameters cannot be frozen."""
    torch.manual_seed(0)
    frozen = timm.create_model("vizkit_gmm_vit_tiny", freeze_mask=True)
    torch.manual_seed(0)
    learned = timm.create_model("vizkit_gmm_vit_tiny")
    pairs = zip(frozen.state_dict().values(), learned.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    start = {n: p.detach().clone() for n, p in frozen.named_parameters()}
    optimizer = torch.optim.AdamW(frozen.parameters(), lr=1e-2, weight_decay=0.05)
    for _ in range(2):
        loss = frozen(torch.randn(4, 3, 32, 32)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    moved = {n for n, p in frozen.named_parameters() if not torch.equal(p, start[n])}
    mask_params = {n for n in start if ".attn.mask." in n}
    assert len(mask_params) == 2 * len(frozen.blocks)  # alpha and sigma per block
    assert not moved & mask_params and moved == set(start) - mask_params
    with pytest.raises(ValueError, match="mask 'none' has no parameters to freeze"):
        timm.create_model("vizkit_gap_vit_tiny", freeze_mask=True)
    with pytest.raises(ValueError, match="mask 'local' has no parameters to freeze"):
        timm.create_model("vizkit_local_vit_tiny", freeze_mask=True)
    with pytest.raises(ValueError, match="the ELM starts at zero"):
        timm.create_model("vizkit_elm_vit_tiny", freeze_mask=True)
    with pytest.raises(ValueError, match="is the fixed decay"):
        timm.create_model("vizkit_rmt_vit_tiny", freeze_mask=True, learnable_gamma=True)
