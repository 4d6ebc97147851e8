"""CKA against an independent numpy implementation of Kornblith et al. 2019 (Gram form with
Székely-Rizzo U-centering, and the feature-space form), its invariances, the minibatch estimator
and the layer x layer matrix over models."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

import vizkit as vk
from vizkit.analysis import cka_matrix, feature_evolution
from vizkit.analysis.cka_kernels import kernel
from vizkit.analysis.minibatch_cka import MinibatchCKA

# --- numpy oracle (written from the paper's definitions, not from vizkit) -------------------


def np_gram_linear(x):
    return x @ x.T


def np_gram_rbf(x, bandwidth=1.0):
    sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    median = np.median(sq[~np.eye(len(x), dtype=bool)])
    return np.exp(-sq / (2 * bandwidth**2 * median))


def np_center_gram(gram, unbiased):
    gram = gram.copy()
    n = len(gram)
    if unbiased:  # U-centering (Székely & Rizzo 2014)
        np.fill_diagonal(gram, 0)
        means = gram.sum(0) / (n - 2)
        means -= means.sum() / (2 * (n - 1))
        gram -= means[:, None] + means[None, :]
        np.fill_diagonal(gram, 0)
        return gram
    h = np.eye(n) - 1 / n
    return h @ gram @ h


def np_cka(gram_x, gram_y, unbiased=False):
    gx, gy = np_center_gram(gram_x, unbiased), np_center_gram(gram_y, unbiased)
    return (gx * gy).sum() / np.sqrt((gx * gx).sum() * (gy * gy).sum())


def np_feature_space_cka(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def np_unbiased_hsic(gram_x, gram_y):
    n = len(gram_x)
    gx, gy = np_center_gram(gram_x, True), np_center_gram(gram_y, True)
    return (gx * gy).sum() / (n * (n - 3))


def features(n, p1, p2, seed=0):
    """Two related representations: y is a noisy nonlinear function of x."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p1)) + 3.0  # an offset: centering must handle it
    y = np.tanh(x @ rng.normal(size=(p1, p2)) / np.sqrt(p1)) + 0.3 * rng.normal(size=(n, p2))
    return x, y


# --- cka() -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,p1,p2", [(200, 10, 7), (20, 50, 80), (30, 8, 60)])
@pytest.mark.parametrize("unbiased", [False, True])
def test_linear_cka_matches_numpy_gram_form(n, p1, p2, unbiased):
    # (200, 10, 7): vizkit uses the feature form; (20, 50, 80): the Gram form; (30, 8, 60): both
    x, y = features(n, p1, p2)
    expected = np_cka(np_gram_linear(x), np_gram_linear(y), unbiased)
    got = vk.cka(torch.from_numpy(x), torch.from_numpy(y), unbiased=unbiased)
    assert got == pytest.approx(expected, abs=1e-6)
    if not unbiased:
        assert got == pytest.approx(np_feature_space_cka(x, y), abs=1e-6)


def test_float32_inputs_are_accumulated_in_float64():
    x, y = features(500, 40, 30)
    got = vk.cka(torch.from_numpy(x).float(), torch.from_numpy(y).float())
    expected = np_cka(np_gram_linear(x.astype(np.float32)), np_gram_linear(y.astype(np.float32)))
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize("bandwidth", [0.5, 1.0, 2.0])
def test_rbf_cka_matches_numpy(unbiased, bandwidth):
    x, y = features(40, 6, 9)
    expected = np_cka(np_gram_rbf(x, bandwidth), np_gram_rbf(y, bandwidth), unbiased)
    got = vk.cka(
        torch.from_numpy(x), torch.from_numpy(y), "rbf", unbiased=unbiased, bandwidth=bandwidth
    )
    assert got == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("kind", ["linear", "rbf"])
@pytest.mark.parametrize("unbiased", [False, True])
def test_cka_of_a_representation_with_itself_is_one(kind, unbiased):
    x = torch.from_numpy(features(30, 12, 1)[0])
    assert vk.cka(x, x, kind, unbiased) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("kind", ["linear", "rbf"])
def test_invariant_to_orthogonal_transforms_and_isotropic_scaling(kind):
    x, y = (torch.from_numpy(a) for a in features(60, 10, 12))
    q, _ = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64))
    base = vk.cka(x, y, kind)
    assert vk.cka(x, y @ q, kind) == pytest.approx(base, abs=1e-9)
    assert vk.cka(x, 7.5 * y, kind) == pytest.approx(base, abs=1e-9)
    assert vk.cka(x * 0.01, y @ q * 3, kind) == pytest.approx(base, abs=1e-9)


def test_linear_cka_is_not_invariant_to_invertible_linear_maps():
    x, _ = features(100, 10, 1)
    x = torch.from_numpy(x)
    stretch = torch.diag(torch.tensor([50.0] + [1.0] * 9, dtype=torch.float64))  # invertible
    assert torch.linalg.matrix_rank(stretch) == 10
    assert vk.cka(x, x @ stretch) < 0.5  # one direction dominates the stretched copy


def test_cka_errors_are_clear():
    x = torch.randn(10, 5)
    with pytest.raises(ValueError, match="same examples"):
        vk.cka(x, torch.randn(9, 5))
    with pytest.raises(ValueError, match="at least 4 examples"):
        vk.cka(x[:3], x[:3], unbiased=True)
    with pytest.raises(ValueError, match="zero variance"):
        vk.cka(x, torch.ones(10, 5))
    with pytest.raises(ValueError, match="kernel must be one of"):
        vk.cka(x, x, kernel="poly")
    with pytest.raises(ValueError, match="median pairwise distance is 0"):
        vk.cka(x, torch.cat([torch.zeros(8, 5), torch.ones(2, 5)]), kernel="rbf")


# --- minibatch estimator --------------------------------------------------------------------


def test_minibatch_hsic_is_the_mean_of_per_batch_unbiased_hsic():
    x, y = features(96, 10, 20)
    acc = MinibatchCKA(["x", "y"])
    per_batch = []
    for xb, yb in zip(np.split(x, 6), np.split(y, 6), strict=True):
        acc.update([kernel(torch.from_numpy(xb)), kernel(torch.from_numpy(yb))])
        gx, gy = np_gram_linear(xb), np_gram_linear(yb)
        per_batch.append([np_unbiased_hsic(gx, gy), np_unbiased_hsic(gx, gx)])
    hxy, hxx = np.mean(per_batch, 0)
    assert acc.hsic()[0, 1].item() == pytest.approx(hxy, rel=1e-9)
    assert acc.hsic()[0, 0].item() == pytest.approx(hxx, rel=1e-9)


def test_minibatch_unbiased_estimate_converges_to_the_full_data_value():
    x, y = features(16384, 8, 6, seed=3)
    full = vk.cka(torch.from_numpy(x), torch.from_numpy(y), unbiased=True)
    errors = {}
    acc = MinibatchCKA(["x", "y"])
    for i, (xb, yb) in enumerate(zip(np.split(x, 512), np.split(y, 512), strict=True)):
        acc.update([kernel(torch.from_numpy(xb)), kernel(torch.from_numpy(yb))])
        if i + 1 in (4, 32, 512):
            errors[i + 1] = abs(acc.cka()[0, 1].item() - full)
    assert errors[512] < errors[4]
    assert errors[512] < 0.01
    # the biased per-batch estimate does not converge: its bias depends on the batch size
    biased = MinibatchCKA(["x", "y"], unbiased=False)
    for xb, yb in zip(np.split(x, 512), np.split(y, 512), strict=True):
        biased.update([kernel(torch.from_numpy(xb)), kernel(torch.from_numpy(yb))])
    assert abs(biased.cka()[0, 1].item() - full) > 5 * errors[512]


# --- cka_matrix over models ------------------------------------------------------------------


def tiny_vit(seed=0, **kwargs):
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224",
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=2,
        num_classes=5,
        **kwargs,
    ).eval()


def images(n=24, seed=1):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def block_outputs(model, x):
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(x, names="blocks.*.hook_resid_post")
    return [cache[n].flatten(1).double().numpy() for n in cache]


def test_cka_matrix_equals_the_numpy_minibatch_oracle():
    model, x = tiny_vit(), images(24)
    result = cka_matrix(model, x, batch_size=8, progress=False)
    layers = [block_outputs(model, xb) for xb in x.split(8)]  # per batch, per layer
    depth = len(layers[0])
    hsic = np.zeros((depth, depth))
    for batch in layers:
        grams = [np_gram_linear(f) for f in batch]
        hsic += [[np_unbiased_hsic(a, b) for b in grams] for a in grams]
    expected = hsic / np.sqrt(np.outer(hsic.diagonal(), hsic.diagonal()))
    assert result.matrix.numpy() == pytest.approx(expected, abs=1e-6)
    assert result.layers_a == [f"blocks.{i}.hook_resid_post" for i in range(3)]
    assert result.options["examples"] == 24 and result.options["batches"] == 3


def test_cka_matrix_one_batch_equals_pairwise_cka():
    model, x = tiny_vit(), images(16)
    result = cka_matrix(model, x, batch_size=16, unbiased=False, kernel="rbf", progress=False)
    feats = [torch.from_numpy(f) for f in block_outputs(model, x)]
    for i, a in enumerate(feats):
        for j, b in enumerate(feats):
            assert result.matrix[i, j].item() == pytest.approx(vk.cka(a, b, "rbf"), abs=1e-9)


def test_cka_matrix_accepts_loaders_and_tuples_and_a_second_model():
    model, other, x = tiny_vit(0), tiny_vit(1), images(16)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, torch.zeros(16)), batch_size=8
    )
    from_loader = cka_matrix(model, loader, model_b=other, progress=False)
    from_tensor = cka_matrix(model, x, model_b=other, batch_size=8, progress=False)
    assert torch.allclose(from_loader.matrix, from_tensor.matrix)
    assert from_loader.layers_b == [f"blocks.{i}.hook_resid_post" for i in range(3)]
    # a model against itself as model_b is the within-model matrix
    within = cka_matrix(model, x, batch_size=8, progress=False)
    twice = cka_matrix(model, x, model_b=model, batch_size=8, progress=False)
    assert torch.allclose(within.matrix, twice.matrix, atol=1e-12)


def test_vit_against_resnet_uses_each_models_blocks():
    vit = tiny_vit()
    torch.manual_seed(0)
    resnet = timm.create_model("resnet10t", num_classes=5).eval()
    result = cka_matrix(vit, images(16), model_b=resnet, batch_size=8, progress=False)
    assert result.matrix.shape == (3, 4)
    assert result.layers_b[0] == "layer1.0.hook_out"
    assert torch.isfinite(result.matrix).all()
    pooled = cka_matrix(
        vit, images(16), model_b=resnet, tokens="mean_patches", batch_size=8, progress=False
    )
    assert pooled.options["tokens"] == "mean_patches"
    assert not torch.allclose(pooled.matrix, result.matrix)


@pytest.mark.parametrize("tokens", ["cls", "mean_patches", "tokens"])
def test_token_modes_match_cka_on_the_selected_features(tokens):
    model, x = tiny_vit(), images(8)
    result = cka_matrix(model, x, tokens=tokens, unbiased=False, batch_size=8, progress=False)
    hm = vk.HookedModel(model)
    _, cache = hm.run_with_cache(x, names="blocks.*.hook_resid_post")
    a, b = cache["blocks.0.hook_resid_post"], cache["blocks.2.hook_resid_post"]
    select = {
        "cls": lambda t: t[:, 0],
        "mean_patches": lambda t: t[:, 1:].mean(1),
        "tokens": lambda t: t.flatten(0, 1),
    }[tokens]
    expected = vk.cka(select(a), select(b))  # float32 features: equal to their rounding
    assert result.matrix[0, 2].item() == pytest.approx(expected, abs=1e-7)


def test_layers_b_within_one_model():
    model, x = tiny_vit(), images(8)
    result = cka_matrix(
        model,
        x,
        layers="blocks.0.hook_resid_post",
        layers_b="blocks.*.hook_resid_post",
        batch_size=8,
        progress=False,
    )
    full = cka_matrix(model, x, batch_size=8, progress=False)
    assert result.matrix.shape == (1, 3)
    assert torch.allclose(result.matrix[0], full.matrix[0])


def test_cka_matrix_errors_are_clear(cait):
    model, x = tiny_vit(), images(8)
    with pytest.raises(ValueError, match="tokens must be one of"):
        cka_matrix(model, x, tokens="patches", progress=False)
    with pytest.raises(ValueError, match="needs >= 4 per batch"):
        cka_matrix(model, images(10), batch_size=8, progress=False)  # last batch: 2 images
    with pytest.raises(ValueError, match="same number of tokens"):
        cka_matrix(
            model,
            x,
            layers=["hook_embed", "blocks.0.hook_resid_post"],
            tokens="tokens",
            progress=False,
        )
    cait_model, cait_x = cait
    with pytest.raises(ValueError, match="no class token"):
        cka_matrix(
            cait_model, cait_x.repeat(2, 1, 1, 1), tokens="cls", unbiased=False, progress=False
        )
    with pytest.raises(ValueError, match="constant across the examples"):
        cka_matrix(
            model, torch.zeros(8, 3, 32, 32), layers="patch_embed.proj.hook_out", progress=False
        )
    with pytest.raises(ValueError, match="No default layers"):
        cka_matrix(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), x, progress=False)
    with pytest.raises(TypeError, match=r"a tensor of images \(B, C, H, W\)"):
        cka_matrix(model, [[1, 2]], progress=False)
    with pytest.raises(ValueError, match="data was empty"):
        cka_matrix(model, [], progress=False)


def test_cka_matrix_leaves_no_hook_behind():
    model, x = tiny_vit(), images(8)
    with pytest.raises(ValueError):
        cka_matrix(
            model,
            x,
            layers=["hook_embed", "blocks.0.hook_resid_post"],
            tokens="tokens",
            progress=False,
        )
    leftover = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert not leftover


def test_feature_evolution_is_eq2_of_the_refiner_paper():
    model, x = tiny_vit(), images(16)
    evo = feature_evolution(model, x, batch_size=8, progress=False)
    m = evo.cka.matrix
    assert evo.curve[0].item() == pytest.approx(1.0)
    assert evo.curve[-1].item() == pytest.approx(1 / m[0, -1].item())  # F_out = 1/CKA(f_in, f_out)
    assert torch.allclose(evo.curve, m[:, -1] / m[0, -1])
    assert torch.allclose(evo.vs_first, m[:, 0])
    assert evo.depth.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert evo.layers == evo.cka.layers_a
    with pytest.raises(ValueError, match="at least 2 layers"):
        feature_evolution(model, x, layers="blocks.0.hook_resid_post", progress=False)


def test_cka_matrix_batches_a_dataset_like_the_tensor_it_holds():
    model, x = tiny_vit(), images(16)
    dataset = torch.utils.data.TensorDataset(x, torch.zeros(16))
    from_dataset = cka_matrix(model, dataset, batch_size=8, progress=False)
    from_tensor = cka_matrix(model, x, batch_size=8, progress=False)
    torch.testing.assert_close(from_dataset.matrix, from_tensor.matrix)
    with pytest.raises(TypeError, match=r"Tensor of shape \(3, 32, 32\)"):
        cka_matrix(model, list(x), progress=False)
