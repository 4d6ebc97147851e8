"""CKA numerics: offsets (a layer's bias) and scales must not change the value, non-finite
features are refused by name, constant features are told apart from tiny ones, and
tokens='cls' is refused on a model without a class token.

The reference is written here from the definitions, not from vizkit: linear CKA of Kornblith
et al. 2019 ("Similarity of Neural Network Representations Revisited"),
``HSIC(K, L) = tr(K H L H) / (n-1)²`` with the explicit centering matrix ``H = I - 11ᵀ/n``, and
the unbiased HSIC of Song et al. 2012 (Eq. 5) on the Gram matrices of ``H X``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import timm
import torch

import vizkit as vk
from vizkit.analysis import cka_matrix
from vizkit.analysis.cka_kernels import Kernel, check_kernels, cka_from_hsic, hsic_matrix, kernel
from vizkit.analysis.minibatch_cka import MinibatchCKA

# --- reference ------------------------------------------------------------------------------


def ref_hsic(k, g, unbiased):
    n = len(k)
    h = np.eye(n) - np.ones((n, n)) / n
    if not unbiased:
        return np.trace(k @ h @ g @ h) / (n - 1) ** 2
    k, g, one = k - np.diag(np.diag(k)), g - np.diag(np.diag(g)), np.ones(n)
    return (
        np.trace(k @ g)
        + (one @ k @ one) * (one @ g @ one) / ((n - 1) * (n - 2))
        - 2 / (n - 2) * one @ k @ g @ one
    ) / (n * (n - 3))


def ref_gram(x):
    """Linear Gram matrix of the features centered by the explicit centering matrix H."""
    n = len(x)
    centered = (np.eye(n) - np.ones((n, n)) / n) @ x
    return centered @ centered.T


def ref_cka(x, y, unbiased=False):
    k, g = ref_gram(x), ref_gram(y)
    return ref_hsic(k, g, unbiased) / np.sqrt(ref_hsic(k, k, unbiased) * ref_hsic(g, g, unbiased))


def pair(n, p, seed=0):
    """Two related representations of n examples: x (n, p) and a noisy function of it."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p))
    y = np.tanh(x @ rng.normal(size=(p, 24)) / np.sqrt(p)) + 0.5 * rng.normal(size=(n, 24))
    return x, y


SHAPES = {"wide": (20, 60), "narrow": (80, 6)}  # n < p: Gram form; n > p: feature form


def value(x, y, kind="linear", unbiased=False):
    return vk.cka(torch.from_numpy(x), torch.from_numpy(y), kind, unbiased)


# --- offsets and scales ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize("kind", ["linear", "rbf"])
@pytest.mark.parametrize("offset", [1e3, 1e4, 1e6])
def test_an_offset_does_not_change_cka(shape, unbiased, kind, offset):
    x, y = pair(*SHAPES[shape])
    base = value(x, y, kind, unbiased)
    assert value(x + offset, y, kind, unbiased) == pytest.approx(base, abs=1e-9)
    assert value(x, y - offset, kind, unbiased) == pytest.approx(base, abs=1e-9)
    # a bias: a different offset per feature, on both representations
    rng = np.random.default_rng(1)
    bias_x = offset * (1 + rng.random(x.shape[1]))
    bias_y = -offset * (1 + rng.random(y.shape[1]))
    assert value(x + bias_x, y + bias_y, kind, unbiased) == pytest.approx(base, abs=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize("kind", ["linear", "rbf"])
@pytest.mark.parametrize("scale", [1e-150, 1e-13, 1e8, 1e150])
def test_a_scale_does_not_change_cka(shape, unbiased, kind, scale):
    x, y = pair(*SHAPES[shape])
    base = value(x, y, kind, unbiased)
    assert value(x * scale, y, kind, unbiased) == pytest.approx(base, abs=1e-9)
    assert value(x * scale, y / scale, kind, unbiased) == pytest.approx(base, abs=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_linear_cka_equals_the_reference(shape, unbiased, offset):
    x, y = pair(*SHAPES[shape], seed=2)
    expected = ref_cka(x, y, unbiased)
    assert 0.05 < abs(expected) < 0.95  # not a degenerate case
    assert value(x + offset, y, unbiased=unbiased) == pytest.approx(expected, abs=1e-9)
    assert ref_cka(x + offset, y, unbiased) == pytest.approx(expected, abs=1e-9)


# --- constant, tiny and non-finite features -------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("level", [0.0, 3.7, 1e6 + 0.1, 1e-300])
def test_truly_constant_features_are_refused(shape, level):
    n, p = SHAPES[shape]
    x, y = pair(n, p)
    constant = np.full((n, p), level)
    with pytest.raises(ValueError, match="zero variance"):
        value(constant, y)
    row = np.random.default_rng(3).normal(size=p) * 1e6  # every example the same features
    with pytest.raises(ValueError, match="zero variance"):
        value(x, np.broadcast_to(row, (n, p)).copy())


@pytest.mark.parametrize("shape", SHAPES)
def test_constant_features_next_to_varying_ones_are_ignored(shape):
    x, y = pair(*SHAPES[shape])
    n = len(x)
    padded = np.concatenate([x, np.full((n, 3), 1e6 + 0.1), np.full((n, 2), -7.0)], axis=1)
    for unbiased in (False, True):
        base = value(x, y, unbiased=unbiased)
        assert value(padded, y, unbiased=unbiased) == pytest.approx(base, abs=1e-12)


def test_constant_features_are_exactly_zero_after_centering():
    x, _ = pair(*SHAPES["narrow"])  # narrow: the kernel keeps the centered features
    n = len(x)
    padded = np.concatenate([x, np.full((n, 2), 1e6 + 0.1), np.full((n, 1), 3e38)], axis=1)
    for dtype in (torch.float64, torch.float32):
        k = kernel(torch.from_numpy(padded).to(dtype))
        assert (k.features[:, -3:] == 0).all() and not k.constant


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_features_give_the_cka_of_their_values(dtype):
    # half features are centered and multiplied in float32, like float32 ones
    x, y = (torch.from_numpy(v).to(dtype) for v in pair(32, 300))
    expected = vk.cka(x.double(), y.double(), unbiased=True)
    assert vk.cka(x, y, unbiased=True) == pytest.approx(expected, abs=1e-6)
    got = kernel(x + 40)  # an offset, in the half dtype's own rounding
    assert got.gram.dtype == torch.float64 and torch.isfinite(got.gram).all()


def test_features_whose_float32_sum_overflows_are_refused_with_a_fix_that_works():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 200, generator=g) * 3e37, torch.randn(64, 5, generator=g)
    with pytest.raises(ValueError, match=r"x: \d+ of its 200 torch.float32 features .* overflows"):
        vk.cka(x, y)
    assert 0 < vk.cka(x.double(), y.double()) < 1  # the fix the message gives


def test_tiny_features_are_not_called_constant():
    x, y = pair(*SHAPES["wide"])
    assert value(x * 1e-13, y) == pytest.approx(value(x, y), abs=1e-12)
    k = kernel(torch.from_numpy(x * 1e-13))
    assert not k.constant


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("shape", SHAPES)
def test_non_finite_features_are_refused_by_name(bad, shape):
    x, y = pair(*SHAPES[shape])
    broken = torch.from_numpy(y.copy())
    broken[2, 1] = bad
    broken[5, 0] = bad
    what = (
        "NaN values in 2 and Inf values in 0"
        if bad != bad
        else "NaN values in 0 and Inf values in 2"
    )
    with pytest.raises(ValueError, match=f"y has {what}"):
        vk.cka(torch.from_numpy(x), broken)
    with pytest.raises(ValueError, match=f"x has {what}"):
        vk.cka(broken, torch.from_numpy(x), "rbf", unbiased=True)
    with pytest.raises(ValueError, match=f"block 3 has {what}"):
        kernel(broken, name="block 3")


def test_non_finite_hsic_is_refused_not_returned():
    # a Gram matrix built by hand, past `kernel`: the readout still refuses NaN
    acc = MinibatchCKA(["a", "b"])
    good = kernel(torch.randn(8, 3, dtype=torch.float64))
    bad = Kernel(gram=torch.full((8, 8), float("nan"), dtype=torch.float64))
    acc.update([good, bad])
    with pytest.raises(ValueError, match=r"HSIC involving \['a', 'b'\] is NaN or Inf"):
        acc.cka()


# --- minibatch ------------------------------------------------------------------------------


def minibatch(batches, unbiased=True):
    acc = MinibatchCKA(["x", "y"], unbiased)
    for xb, yb in batches:
        acc.update([kernel(torch.from_numpy(xb)), kernel(torch.from_numpy(yb))])
    return acc


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [1e3, 1e4, 1e6])
def test_minibatch_cka_is_offset_invariant_and_equals_the_reference(shape, offset):
    n, p = SHAPES[shape]
    x, y = pair(4 * n, p, seed=4)
    batches = list(zip(np.split(x, 4), np.split(y, 4), strict=True))
    base = minibatch(batches)
    # the mean over batches of the reference's unbiased HSIC
    hsic = np.mean(
        [
            [[ref_hsic(ref_gram(a), ref_gram(b), True) for b in (xb, yb)] for a in (xb, yb)]
            for xb, yb in batches
        ],
        axis=0,
    )
    expected = hsic[0, 1] / np.sqrt(hsic[0, 0] * hsic[1, 1])
    assert base.cka()[0, 1].item() == pytest.approx(expected, abs=1e-9)
    shifted = minibatch([(xb + offset, yb - offset) for xb, yb in batches])
    torch.testing.assert_close(shifted.hsic(), base.hsic(), rtol=1e-9, atol=0)
    assert shifted.cka()[0, 1].item() == pytest.approx(expected, abs=1e-9)
    # the unbiased estimate is offset-invariant per batch: a different offset in every batch
    drifting = minibatch([(xb + i * offset, yb) for i, (xb, yb) in enumerate(batches)])
    assert drifting.cka()[0, 1].item() == pytest.approx(expected, abs=1e-9)


def test_minibatch_refuses_a_representation_constant_in_every_batch():
    x, y = pair(32, 6)
    batches = [
        (xb, np.full_like(yb, 1e6 + 0.1))
        for xb, yb in zip(np.split(x, 4), np.split(y, 4), strict=True)
    ]
    with pytest.raises(ValueError, match="constant across the examples"):
        minibatch(batches).cka()


# --- cka_matrix -----------------------------------------------------------------------------


def tiny_vit(seed=0, **kwargs):
    torch.manual_seed(seed)
    options = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    return timm.create_model("vit_tiny_patch16_224", **{**options, **kwargs}).eval()


def images(n=8, seed=1):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_cls_is_refused_on_a_model_with_registers_and_no_class_token():
    model = tiny_vit(class_token=False, reg_tokens=4, global_pool="avg")
    assert vk.HookedModel(model).token_layout((32, 32)).num_prefix_tokens == 4
    with pytest.raises(ValueError, match="this model has no class token.*mean_patches"):
        cka_matrix(model, images(), tokens="cls", progress=False)
    pooled = cka_matrix(model, images(), tokens="mean_patches", progress=False)
    assert torch.isfinite(pooled.matrix).all()


def test_cls_still_reads_the_class_token_next_to_registers():
    model, x = tiny_vit(reg_tokens=2), images()
    result = cka_matrix(model, x, tokens="cls", unbiased=False, progress=False)
    _, cache = vk.HookedModel(model).run_with_cache(x, names="blocks.*.hook_resid_post")
    a, b = (cache[f"blocks.{i}.hook_resid_post"][:, 0] for i in (0, 1))
    # float32 features, multiplied in float32: equal to their rounding
    assert result.matrix[0, 1].item() == pytest.approx(vk.cka(a, b), abs=1e-7)


def test_cka_matrix_of_a_layer_with_a_large_bias():
    # float64, so that the model itself does not round the biased activations
    model, x = tiny_vit().double(), images(16).double()
    biased = tiny_vit().double()
    with torch.no_grad():
        biased.blocks[0].mlp.fc2.bias += 1e4  # carried by the residual stream to the output
    expected = cka_matrix(model, x, batch_size=8, progress=False).matrix
    got = cka_matrix(biased, x, batch_size=8, progress=False).matrix
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)


def test_cka_matrix_names_the_layer_with_nan():
    model = tiny_vit()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.bias[3] = float("nan")
    with pytest.raises(
        ValueError, match=r"layer 'blocks.1.hook_resid_post' .* has NaN values in \d+"
    ):
        cka_matrix(model, images(), progress=False)


def test_features_that_vary_only_at_float32_rounding_warn():
    base = torch.full((8, 16), 3.0)
    noise = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    x = (base + noise * 3e-7).float()  # steps of one float32 ulp around 3
    with pytest.warns(UserWarning, match="rounding level of torch.float32"):
        kernel(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel(base + noise)


@pytest.mark.parametrize("kind", ["linear", "rbf"])
@pytest.mark.parametrize("p", [5, 40])
def test_building_and_accumulating_kernels_never_reads_values(kind, p):
    # meta tensors have no values: any host read (.item, .tolist, bool) of one raises, so
    # this is the per-layer path without a host sync on a GPU
    x, y = (torch.empty(16, p, device="meta") for _ in range(2))
    kernels = [kernel(x, kind, name="a", check=False), kernel(y, kind, name="b", check=False)]
    acc = MinibatchCKA(["a", "b"])
    acc.update(kernels)
    assert acc.hsic_sum.shape == (2, 2) and acc.hsic_sum.dtype == torch.float64
    with pytest.raises((RuntimeError, NotImplementedError)):
        kernel(x, kind, name="a")  # check=True reads the flags


def test_one_check_reads_every_kernel_and_names_the_broken_one():
    good = torch.randn(8, 4)
    broken = good.clone()
    broken[3, 2] = float("nan")
    kernels = [kernel(v, name=n, check=False) for n, v in [("a", good), ("b", broken)]]
    with pytest.raises(ValueError, match="b has NaN values in 1 and Inf values in 0 of its 4"):
        check_kernels(kernels)


@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_float32_features_give_the_cka_of_their_float64_values(unbiased, offset):
    # float32 features are centered and multiplied in float32 (the Gram matrix); the result
    # must be that of the same values in float64 to far better than the features' own rounding
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(48, 6, generator=g)  # three views of one latent, partly overlapping
    views = [(slice(0, 4), 1.0), (slice(2, 6), 1e-3), (slice(0, 6), 50.0)]
    reps = [
        (
            shared[:, c] @ torch.randn(c.stop - c.start, 3000, generator=g)
            + torch.randn(48, 3000, generator=g)
        )
        * scale
        + offset
        for c, scale in views
    ]
    names = ["a", "b", "c"]
    single = [kernel(r.float()) for r in reps]
    double = [kernel(r.float().double()) for r in reps]
    assert single[0].gram is not None and single[0].gram.dtype == torch.float64
    got = cka_from_hsic(hsic_matrix(single, unbiased), names)
    expected = cka_from_hsic(hsic_matrix(double, unbiased), names)
    assert 0.05 < expected[0, 1].abs() < 0.95  # not a degenerate case
    torch.testing.assert_close(got, expected, rtol=0, atol=5e-8)


def test_each_batch_of_images_is_checked_once(monkeypatch):
    # each check of the images is a host sync on a GPU (tests/test_gpu.py counts them there)
    from vizkit.hooks import inputs

    checked = []
    check = inputs.check_values_finite
    monkeypatch.setattr(inputs, "check_values_finite", lambda *a: checked.append(a[0]) or check(*a))
    model = timm.create_model("test_vit", depth=2).eval()
    x = torch.randn(16, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    cka_matrix(model, x, batch_size=4, progress=False)
    assert checked.count("images") == 4
