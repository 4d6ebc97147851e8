"""Token norms and token PCA against independent computations: timm's `forward_intermediates`
for the tokens, scikit-learn's PCA for the components, and an injected high-norm token for the
outlier criterion of Darcet et al. (2024)."""

from __future__ import annotations

import pytest
import timm
import torch
from sklearn.decomposition import PCA

import vizkit as vk

DEPTH, WIDTH = 3, 32


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", img_size=64, depth=DEPTH, embed_dim=WIDTH,
                              num_heads=2, reg_tokens=2).eval()  # fmt: skip
    return model, torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def timm_tokens(model, x, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix (B, P, C), patches (B, C, gh, gw)) of block ``layer`` by timm's own API."""
    with torch.no_grad():
        ((patches, prefix),) = model.forward_intermediates(
            x, indices=[layer], norm=False, return_prefix_tokens=True, intermediates_only=True
        )
    return prefix, patches


def test_norms_are_timms_tokens_norms(vit):
    model, x = vit
    result = vk.token_norms(model, x)
    assert result.patches.shape == (3, DEPTH, 4, 4) and result.prefix.shape == (3, DEPTH, 3)
    assert result.layers == [f"blocks.{i}.hook_resid_post" for i in range(DEPTH)]
    for layer in range(DEPTH):
        prefix, patches = timm_tokens(model, x, layer)
        torch.testing.assert_close(result.prefix[:, layer], prefix.norm(dim=-1))
        torch.testing.assert_close(result.patches[:, layer], patches.norm(dim=1))
    last = vk.token_norms(model, x, layers=-1)
    assert last.layers == [f"blocks.{DEPTH - 1}.hook_resid_post"]
    torch.testing.assert_close(last.patches[:, 0], result.patches[:, -1])


def test_an_injected_high_norm_token_is_the_one_flagged(vit):
    model, x = vit
    token, boost = 3 + 6, 30.0  # 3 prefix tokens, then patch 6: row 1, column 2 of the 4 x 4 grid

    def boosted(module, args, output):
        output = output.clone()
        output[0, token] *= boost
        return output

    handle = model.blocks[-1].register_forward_hook(boosted)
    try:
        result = vk.token_norms(model, x)
    finally:
        handle.remove()
    flagged = result.high_norm()
    assert flagged[:, :-1].sum() == 0  # the earlier layers are untouched
    expected = torch.zeros(3, 4, 4, dtype=torch.bool)
    expected[0, 1, 2] = True
    assert torch.equal(flagged[:, -1], expected)
    assert result.high_norm_fraction()[-1] == pytest.approx(1 / (3 * 16))
    cut = result.patches[0, -1, 1, 2].item() - 1e-3
    assert result.high_norm(threshold=cut)[:, -1].sum() == 1
    with pytest.raises(ValueError, match="factor must be a number > 1"):
        result.high_norm(factor=1.0)


def test_pca_is_sklearns(vit):
    model, x = vit
    result = vk.token_pca(model, x, layer=1, components=3)
    _, patches = timm_tokens(model, x, 1)
    tokens = patches.flatten(2).transpose(1, 2).reshape(-1, WIDTH).double().numpy()
    reference = PCA(3).fit(tokens)
    torch.testing.assert_close(
        result.explained_variance_ratio,
        torch.tensor(reference.explained_variance_ratio_, dtype=torch.float32),
    )
    projected = torch.tensor(reference.transform(tokens)).float().reshape(3, 16, 3)
    mine = result.projections.flatten(2).transpose(1, 2)  # (B, Np, k)
    for k in range(3):  # a component is defined up to its sign
        sign = torch.sign((mine[..., k] * projected[..., k]).sum())
        torch.testing.assert_close(mine[..., k], sign * projected[..., k], atol=1e-4, rtol=1e-4)
    largest = result.components.gather(1, result.components.abs().argmax(1, keepdim=True))
    assert (largest > 0).all()  # the sign convention
    assert result.fitted == 3 * 16 and result.layer == "blocks.1.hook_resid_post"
    rgb = result.rgb()
    assert rgb.shape == (3, 4, 4, 3) and rgb.min() == 0 and rgb.max() == 1


def test_pca_fitted_on_a_subset_is_sklearns_on_that_subset(vit):
    model, x = vit
    fit_on = torch.zeros(3, 4, 4, dtype=torch.bool)
    fit_on[:, 1:3, 1:3] = True  # the centre 2 x 2 of every image
    result = vk.token_pca(model, x, components=2, fit_on=fit_on)
    _, patches = timm_tokens(model, x, DEPTH - 1)
    tokens = patches.permute(0, 2, 3, 1)  # (B, gh, gw, C)
    reference = PCA(2).fit(tokens[fit_on].double().numpy())
    assert result.fitted == 12
    torch.testing.assert_close(
        result.explained_variance_ratio,
        torch.tensor(reference.explained_variance_ratio_, dtype=torch.float32),
    )
    everywhere = torch.tensor(reference.transform(tokens.reshape(-1, WIDTH).double().numpy()))
    mine = result.projections.permute(0, 2, 3, 1).reshape(-1, 2).double()
    for k in range(2):
        sign = torch.sign((mine[:, k] * everywhere[:, k]).sum())
        torch.testing.assert_close(mine[:, k], sign * everywhere[:, k], atol=1e-4, rtol=1e-4)


def test_refusals(vit):
    model, x = vit
    with pytest.raises(ValueError, match="components=48, but the 48 fitted tokens"):
        vk.token_pca(model, x, components=48)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="components must be a positive int"):
            vk.token_pca(model, x, components=bad)
    norms = vk.token_norms(model, x)
    for bad in (float("nan"), -1, 0, True):  # issue 69: -1 made every patch an outlier
        with pytest.raises(ValueError, match=r"threshold must be a finite number > 0"):
            norms.high_norm(threshold=bad)
    with pytest.raises(ValueError, match=r"fit_on must be a bool tensor of shape \(3, 4, 4\)"):
        vk.token_pca(model, x, fit_on=torch.ones(3, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="three indices"):
        vk.token_pca(model, x, components=2).rgb()
    cnn = timm.create_model("resnet18", num_classes=4).eval()
    for analysis in (vk.token_norms, vk.token_pca):
        with pytest.raises(ValueError, match="no transformer blocks whose outputs are tokens"):
            analysis(cnn, torch.randn(1, 3, 32, 32))


def test_non_finite_tokens_are_refused(vit):
    model, x = vit

    def poisoned(module, args, output):
        output = output.clone()
        output[:, 4] = float("nan")
        return output

    handle = model.blocks[0].register_forward_hook(poisoned)
    try:
        with pytest.raises(ValueError, match="NaN"):
            vk.token_norms(model, x)
        with pytest.raises(ValueError, match="NaN"):
            vk.token_pca(model, x, layer=0)
    finally:
        handle.remove()


def test_a_hierarchical_model_gives_every_stage_or_takes_one():
    """By default one TokenNorms per stage (tests/test_stages.py); layers asked for must share
    their tokens."""
    torch.manual_seed(0)
    swin = timm.create_model("swin_tiny_patch4_window7_224", img_size=112, depths=(2, 2, 2, 2),
                             num_classes=4).eval()  # fmt: skip
    x = torch.randn(2, 3, 112, 112)
    assert [s.layout.grid for s in vk.token_norms(swin, x)] == [(28, 28), (14, 14), (7, 7), (4, 4)]
    with pytest.raises(ValueError, match=r"different tokens .* layers=\[6, 7\]"):
        vk.token_norms(swin, x, layers=[0, 1, 6, 7])
    last_stage = vk.token_norms(swin, x, layers=[6, 7])
    assert last_stage.patches.shape == (2, 2, 4, 4) and last_stage.prefix.shape == (2, 2, 0)
    assert vk.token_pca(swin, x, layer="layers.1.blocks.1").projections.shape == (2, 3, 14, 14)


def test_pca_refuses_components_the_tokens_do_not_vary_along(vit):
    model, x = vit
    twice = x[:1].repeat(2, 1, 1, 1)
    fit_on = torch.zeros(2, 4, 4, dtype=torch.bool)
    fit_on[:, 0, :2] = True  # four tokens, two of them copies of the other two: one direction
    assert vk.token_pca(model, twice, components=1, fit_on=fit_on).explained_variance_ratio == 1
    with pytest.raises(ValueError, match="vary along only 1 directions"):
        vk.token_pca(model, twice, components=2, fit_on=fit_on)
    fit_on[:, 0, 1] = False  # the same token twice: no variance at all
    with pytest.raises(ValueError, match="vary along only 0 directions"):
        vk.token_pca(model, twice, components=1, fit_on=fit_on)


def test_the_median_rule_takes_the_midpoint():
    layout = vk.TokenLayout(0, (2, 2))
    patches = torch.tensor([1.0, 1.0, 4.5, 4.5]).reshape(1, 1, 2, 2)
    norms = vk.analysis.TokenNorms(torch.zeros(1, 1, 0), patches, ["b"], layout, (32, 32))
    assert not norms.high_norm(factor=2.0).any()  # the median is 2.75, not 1
    assert norms.high_norm(threshold=4.0).sum() == 2


def test_figures_refuse_images_that_are_not_the_batch(vit):
    model, x = vit
    norms, pca = vk.token_norms(model, x), vk.token_pca(model, x)
    shown = vk.viz.display_images(x)
    for figure, result in ((vk.viz.token_norms_figure, norms), (vk.viz.token_pca_figure, pca)):
        figure(result, shown, count=10)  # more than the batch: all of it
        for wrong in (shown.transpose(0, 3, 1, 2), shown[:, :, :32], shown[:1]):
            with pytest.raises(ValueError, match="images must be the analysed batch"):
                figure(result, wrong)
        with pytest.raises(ValueError, match="count must be a positive int"):
            figure(result, count=0)
