"""The model-parameter randomization tests (Adebayo et al. 2018) and the map similarities they
report: Spearman against scipy, SSIM against scikit-image; the user's model bit-identical after;
what each step randomizes, on every covered family."""

from __future__ import annotations

import pytest
import torch
from representatives import drawn, refuses_class_scores, representatives
from scipy import stats

import vizkit as vk
from vizkit import coverage
from vizkit.metrics import sanity
from vizkit.metrics.similarity import spearman, ssim


@pytest.fixture(scope="module")
def shapes_vit():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    x, labels, _ = vk.datasets.load_sample()
    return model, x[:3], labels[:3]


def test_spearman_equals_scipy_with_ties():
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(3, 5, 6, generator=generator)
    b = torch.rand(3, 5, 6, generator=generator)
    a[0, :2] = 0.5  # ties
    b[1] = (b[1] * 4).round()
    expected = [stats.spearmanr(u.ravel(), v.ravel()).statistic for u, v in zip(a, b, strict=True)]
    torch.testing.assert_close(spearman(a, b), torch.tensor(expected, dtype=torch.float64))
    assert spearman(a, torch.ones_like(a)).isnan().all()  # a constant map ranks nothing


def test_ssim_equals_scikit_image():
    from skimage.metrics import structural_similarity

    generator = torch.Generator().manual_seed(1)
    a = torch.rand(2, 16, 12, generator=generator)
    b = a + 0.3 * torch.rand(2, 16, 12, generator=generator)

    def scaled(m):  # each map to [0, 1]
        m = m.double().numpy()
        return (m - m.min()) / (m.max() - m.min())

    expected = [structural_similarity(scaled(a[i]), scaled(b[i]), data_range=1.0) for i in range(2)]
    torch.testing.assert_close(ssim(a, b), torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(ssim(a, a), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(32, 32), (33, 35), (4, 4)])
def test_hog_equals_scikit_image(shape):
    """scikit-image's hog (9 orientations, cells of 8 pixels, or 1 on a 4 x 4 patch grid,
    3 x 3 blocks, L2-Hys), and the similarity is the Pearson correlation of the features."""
    from skimage.feature import hog as skimage_hog

    from vizkit.metrics.similarity import hog, hog_similarity

    generator = torch.Generator().manual_seed(2)
    a, b = torch.rand(2, *shape, generator=generator), torch.rand(2, *shape, generator=generator)
    cell = 1 if shape == (4, 4) else 8
    features = [
        skimage_hog(m.double().numpy(), orientations=9, pixels_per_cell=(cell, cell),
                    cells_per_block=(3, 3), block_norm="L2-Hys")
        for m in (a[0], b[0])
    ]  # fmt: skip
    torch.testing.assert_close(hog(a[:1], cell)[0], torch.from_numpy(features[0]), rtol=1e-6,
                               atol=1e-7)  # fmt: skip
    scaled = [(m - m.min()) / (m.max() - m.min()) for m in (a, b)]
    expected = stats.pearsonr(hog(scaled[0][:1], cell)[0], hog(scaled[1][:1], cell)[0])
    torch.testing.assert_close(hog_similarity(a, b)[0].item(), expected.statistic, rtol=1e-6,
                               atol=1e-9)  # fmt: skip
    torch.testing.assert_close(hog_similarity(a, a), torch.ones(2, dtype=torch.float64))


def test_cascading_randomization_leaves_the_model_bit_identical(shapes_vit):
    model, x, labels = shapes_vit
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = vk.metrics.sanity_check(model, x, "gradcam", target=labels, progress=False)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert result.layers[0] == "head" and result.layers[-1] == ""  # top first, own params last
    assert result.maps.shape == (len(result.layers), *result.original.shape)
    assert set(result.similarity) == {"spearman_abs", "spearman", "ssim", "hog"}
    torch.testing.assert_close(result.original, vk.gradcam(model, x, target=labels).maps)
    assert result.targets.tolist() == labels.tolist()
    # Grad-CAM depends on the head: its maps change once the head is random
    assert result.similarity["spearman_abs"][0].nanmean() < 0.5


def test_each_step_randomizes_its_layer_and_keeps_the_others(shapes_vit, monkeypatch):
    """Independent: step s re-initializes layers[s] alone; cascading: layers[:s + 1]."""
    model, x, _ = shapes_vit
    copies = []
    original = sanity._randomize

    def spy(randomized, path, generator):
        original(randomized, path, generator)
        copies.append({k: v.clone() for k, v in randomized.state_dict().items()})

    monkeypatch.setattr(sanity, "_randomize", spy)
    result = vk.metrics.sanity_check(model, x, "saliency", mode="independent", progress=False)
    trained = model.state_dict()
    for layer, state in zip(result.layers, copies, strict=True):
        inside = [k for k in state if layer == "" and "." not in k or k.startswith(f"{layer}.")]
        changed = [k for k in state if not torch.equal(state[k], trained[k])]
        weights = [k for k in inside if k.endswith("weight") and trained[k].std() > 0]
        assert set(changed) <= set(inside) and set(weights) <= set(changed), layer
    copies.clear()
    vk.metrics.sanity_check(model, x, "saliency", progress=False)
    last = copies[-1]  # cascading: every layer random at the end
    assert all(not torch.equal(last[k], trained[k]) for k in trained if k.endswith("weight"))


def test_a_map_that_ignores_the_model_fails_the_check(shapes_vit):
    """The random baseline does not depend on the weights: its maps stay the same (similarity
    1) however much of the model is randomized, which is what the test exists to catch."""
    model, x, _ = shapes_vit
    result = vk.metrics.sanity_check(model, x, "random", progress=False)
    assert (result.similarity["spearman"] == 1).all()


def test_sanity_check_refuses_bad_arguments(shapes_vit):
    model, x, _ = shapes_vit
    with pytest.raises(KeyError, match="known"):
        vk.metrics.sanity_check(model, x, "lime")
    with pytest.raises(ValueError, match="mode"):
        vk.metrics.sanity_check(model, x, mode="all")
    with pytest.raises(TypeError, match="target must be"):
        vk.metrics.sanity_check(model, x, target="cat")


def test_sanity_figures_name_the_randomized_layers(shapes_vit):
    model, x, _ = shapes_vit
    results = [vk.metrics.sanity_check(model, x, m, progress=False) for m in ("gradcam", "random")]
    images = vk.viz.display_images(x, model)
    grid = vk.viz.sanity_maps(results[0], images, image=1)
    titles = [a.text for a in grid.layout.annotations if a.text]
    assert titles[0] == "trained" and titles[1].startswith("up to head")
    assert len([t for t in grid.data if t.type == "heatmap"]) == len(results[0].layers) + 1
    curves = vk.viz.sanity_curves(results)
    assert [t.name for t in curves.data] == ["gradcam", "random"]
    assert list(curves.data[1].y) == [1.0] * len(results[1].layers)
    assert curves.data[0].x[-1] == "up to own parameters"
    independent = vk.metrics.sanity_check(model, x, "random", mode="independent", progress=False)
    with pytest.raises(ValueError, match="like runs"):
        vk.viz.sanity_curves([results[0], independent])


def test_data_randomization_compares_with_the_model_trained_on_permuted_labels(shapes_vit):
    """The zoo's vit_tiny_shapes_random_labels (its recipe permutes the labels of 500 Shapes
    images): the same classes explained by both models, one step of similarities."""
    model, x, labels = shapes_vit
    randomized, card = vk.zoo.load("vit_tiny_shapes_random_labels")
    assert card["data"]["randomized_labels"] == {"images": 500, "seed": 0}
    randomized.train()  # run in eval mode for the call, the flag restored after
    result = vk.metrics.data_randomization(model, randomized, x, "gradcam", target=labels)
    assert randomized.training
    assert result.mode == "data" and result.layers == ["randomized labels"]
    torch.testing.assert_close(result.maps[0], vk.gradcam(randomized, x, target=labels).maps)
    torch.testing.assert_close(result.original, vk.gradcam(model, x, target=labels).maps)
    expected = sanity.SIMILARITIES["ssim"](result.original, result.maps[0]).float()
    torch.testing.assert_close(result.similarity["ssim"][0], expected)
    with pytest.raises(TypeError, match="architecture"):
        vk.metrics.data_randomization(model, torch.nn.Linear(3, 3), x)


@pytest.mark.slow
@pytest.mark.parametrize(("make", "size"), representatives())
def test_sanity_check_on_every_family(make, size):
    """On each representative of docs/coverage.md: the randomized layers hold every parameter
    of the model (each layer some); the cascading check of the input gradient runs to the end with
    finite maps, leaves the model bit-identical, and the fully randomized model's maps differ
    from the model's."""
    model = drawn(make)
    x = coverage._images(model, size)[:2]
    if refuses_class_scores(model, lambda: vk.sanity_check(model, x, "saliency", progress=False)):
        return
    layers = sanity.randomization_layers(model, x)

    def held(layer: str) -> list[int]:  # the parameters a layer randomizes
        module = model.get_submodule(layer.removesuffix(sanity.OWN))
        whole = bool(layer) and not layer.endswith(sanity.OWN)
        return [id(p) for p in module.parameters(recurse=whole)]

    randomized = {i for layer in layers for i in held(layer)}  # shared ones may recur (CoaT)
    assert randomized == {id(p) for p in model.parameters()}
    assert all(held(layer) for layer in layers)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = vk.sanity_check(model, x, "saliency", progress=False)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert result.layers == layers[::-1] and torch.isfinite(result.maps).all()
    assert result.similarity["spearman_abs"][-1].nanmean() < 0.99
