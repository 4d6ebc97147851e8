"""saev-style 1-D probes (`vizkit.concepts.probe_units`): each probe against scikit-learn's
logistic regression, AP against scikit-learn's, Probe R and purity against hand computations,
a planted unit found, autoencoder latents (zeros in closed form), the store path, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import patch_mean_vit
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, log_loss

import vizkit as vk
from vizkit.analysis.result import Result
from vizkit.concepts import PatchLabels, Probes, patch_labels, probe_units

SIZE, PATCH = 16, 4
STREAM = "blocks.0.hook_resid_pre"  # channel 0: each patch's mean of image channel 0


def _split(count: int, seed: int) -> tuple[torch.Tensor, PatchLabels, torch.Tensor]:
    """Noise images whose patch labels are drawn with P(on) = sigmoid(3 m), m the patch's mean
    of channel 0 (channel 0 of the planted ViT's stream): a probe that no unit separates."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(count, 3, SIZE, SIZE, generator=generator)
    grid = SIZE // PATCH
    means = images[:, 0].view(count, grid, PATCH, grid, PATCH).mean((2, 4))
    drawn = torch.rand(count, grid, grid, generator=generator) < torch.sigmoid(3 * means)
    return images, PatchLabels(["off", "on"], drawn.long()), means


@pytest.fixture(scope="module")
def planted():
    model = patch_mean_vit(SIZE, PATCH, means=1, zeros=1)
    images, labels, means = _split(40, 0)
    test_images, test_labels, test_means = _split(40, 1)
    probes = probe_units(model, STREAM, images, labels, test_images, test_labels, steps=60,
                         progress=False)  # fmt: skip
    return model, probes, (images, labels, means), (test_images, test_labels, test_means)


def test_each_probe_is_scikit_learns_logistic_regression(planted):
    model, probes, (_, labels, means), (_, test_labels, test_means) = planted
    x, y = means.flatten()[:, None].double().numpy(), labels.labels.flatten().numpy()
    reference = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(x, y)
    assert probes.weights[0, 1].item() == pytest.approx(reference.coef_[0, 0], rel=1e-4)
    assert probes.biases[0, 1].item() == pytest.approx(reference.intercept_[0], abs=1e-4)
    # class "off" is the same probe mirrored
    assert probes.weights[0, 0].item() == pytest.approx(-reference.coef_[0, 0], rel=1e-4)
    train = log_loss(y, reference.predict_proba(x)[:, 1])
    assert probes.train_loss[0, 1].item() == pytest.approx(train, rel=1e-6)
    test_x = test_means.flatten()[:, None].double().numpy()
    test_y = test_labels.labels.flatten().numpy()
    test = log_loss(test_y, reference.predict_proba(test_x)[:, 1])
    assert probes.test_loss[0, 1].item() == pytest.approx(test, rel=1e-5)
    # channel 1 is 0 everywhere: its probe predicts the class's share, w = 0
    share = y.mean()
    assert probes.weights[1, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert torch.sigmoid(probes.biases[1, 1]).item() == pytest.approx(share, abs=1e-6)


def test_the_planted_unit_is_each_class_s_unit_and_the_metrics_are_saevs(planted):
    model, probes, _, (_, test_labels, test_means) = planted
    assert probes.best.tolist() == [0, 0] and probes.units[0] == f"{STREAM} 0"
    y = test_labels.labels.flatten()
    share = torch.stack([(y == 0).double().mean(), (y == 1).double().mean()])
    torch.testing.assert_close(probes.test_share.double(), share, rtol=0, atol=1e-7)
    entropy = -(share * share.log() + (1 - share) * (1 - share).log())
    expected_r = 1 - probes.test_loss[0].double().mean() / entropy.mean()
    assert probes.probe_r == pytest.approx(expected_r.item(), rel=1e-6)
    assert probes.probe_r > 0.05  # the unit carries information; chance would be <= 0
    score = test_means.flatten().numpy()
    on = average_precision_score((y == 1).numpy(), score)
    off = average_precision_score((y == 0).numpy(), -score)
    torch.testing.assert_close(probes.ap.double(), torch.tensor([off, on], dtype=torch.float64),
                               rtol=1e-6, atol=0)  # fmt: skip
    assert probes.mean_ap == pytest.approx((on + off) / 2, rel=1e-6)
    # purity@k: the most frequent label among the unit's k largest test values
    order = torch.from_numpy(score).argsort(descending=True, stable=True)
    for j, k in enumerate(probes.purity_k):
        top = y[order[:k]]
        assert probes.purity[1, j].item() == pytest.approx(
            torch.bincount(top).max().item() / k, abs=1e-7)  # fmt: skip
    assert probes.table()[1][:2] == ("on", f"{STREAM} 0")


def test_autoencoder_latents_fit_with_their_zeros_in_closed_form(shapes_sae):
    """Latents are 0 on most patches: the probes' losses equal scikit-learn's fitted on every
    patch's value, zeros included."""
    model, sae = shapes_sae
    images, masks, pixels = _shapes_pixels(24, 0)
    test_images, _, test_pixels = _shapes_pixels(24, 1)
    classes = [*vk.zoo.card("vit_tiny_shapes")["classes"], "background"]
    labels = patch_labels(pixels, (8, 8), classes)
    test_labels = patch_labels(test_pixels, (8, 8), classes)
    probes = probe_units(model, sae, images, labels, test_images, test_labels, steps=60,
                         progress=False)  # fmt: skip
    assert len(probes.units) == sae.latents and probes.options["units"] == "sae"
    latents = vk.concepts.units.read_units(vk.hooks.HookedModel(model), sae, (32, 32),
                                           images[:1])  # fmt: skip
    values = latents.maps(images, range(24)).flatten(2).transpose(1, 2).flatten(0, 1)
    y_all = labels.labels.flatten()
    checked = 0
    for unit in (values > 0).float().mean(0).argsort(descending=True)[:40].tolist():
        for c in range(len(classes)):
            y = (y_all == c).numpy()
            x = values[:, unit : unit + 1].double().numpy()
            if not y.any() or (x[y] > 0).sum() < 3 or (x[~y] > 0).sum() < 3:
                continue
            fit = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(x, y)
            if abs(fit.coef_[0, 0]) > 20:  # nearly separable: the optimum is far out
                continue
            loss = log_loss(y, fit.predict_proba(x)[:, 1], labels=[False, True])
            assert probes.train_loss[unit, c].item() == pytest.approx(loss, rel=1e-5, abs=1e-7)
            checked += 1
    assert checked >= 20
    # the shapes' latents rank their test patches above chance (AP = the class's share): 9 of
    # the 10 at 1.8 to 13 times it on these 24 images
    assert int((probes.ap[:10] >= 1.5 * probes.test_share[:10]).sum()) >= 8


def _shapes_pixels(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shapes test images, their object masks and pixel classes (the shape's class on the
    object, 10 elsewhere)."""
    data = vk.datasets.Shapes("test", n=count, seed=seed)
    images = torch.stack([data[i][0] for i in range(count)])
    pixels = torch.where(data.masks, data.labels[:, None, None].long(), 10)
    return images, data.masks, pixels


def test_patch_labels_take_each_patch_s_majority():
    pixels = torch.zeros(1, 4, 4, dtype=torch.long)
    pixels[0, :2, :2] = torch.tensor([[1, 1], [1, 2]])  # patch (0, 0): 1 wins
    pixels[0, :2, 2:] = torch.tensor([[1, 1], [2, 2]])  # a tie: the lowest class
    labels = patch_labels(pixels, (2, 2), ["a", "b", "c"])
    assert labels.labels.tolist() == [[[1, 1], [0, 0]]]
    with pytest.raises(ValueError, match="do not split"):
        patch_labels(pixels, (3, 3), ["a", "b", "c"])


def test_the_store_path_and_the_round_trip(tmp_path, planted):
    model, probes, (images, labels, _), (test_images, test_labels, _) = planted
    write = lambda x, name: vk.cache_activations(model, x, tmp_path / name, layers=[STREAM],  # noqa: E731
                                                 tokens="patches", progress=False)  # fmt: skip
    stored = probe_units(model, STREAM, None, labels, None, test_labels, steps=60,
                         store=write(images, "train"), test_store=write(test_images, "test"),
                         batch_size=7, progress=False)  # fmt: skip
    torch.testing.assert_close(stored.train_loss, probes.train_loss)
    torch.testing.assert_close(stored.ap, probes.ap, equal_nan=True)
    back = Result.from_dict(json.loads(json.dumps(probes.to_dict(), allow_nan=False)))
    assert isinstance(back, Probes) and back.probe_r == probes.probe_r


def test_refusals(planted):
    model, _, (images, labels, _), (test_images, test_labels, _) = planted
    other = PatchLabels(["a", "b"], labels.labels)
    with pytest.raises(ValueError, match="classes differ"):
        probe_units(model, STREAM, images, labels, test_images, other, progress=False)
    fewer = PatchLabels(labels.classes, labels.labels[:5])
    with pytest.raises(ValueError, match="holds 40 images but 5 images' patch labels"):
        probe_units(model, STREAM, images, fewer, test_images, test_labels, progress=False)
    coarse = PatchLabels(labels.classes, labels.labels[:, :2, :2].contiguous())
    with pytest.raises(ValueError, match="4x4 patch grid"):
        probe_units(model, STREAM, images, coarse, test_images, test_labels, progress=False)
    with pytest.raises(ValueError, match=r"class indices in \[0, 2\)"):
        PatchLabels(["a", "b"], labels.labels + 1)
    with pytest.raises(TypeError, match="int64"):
        PatchLabels(["a", "b"], labels.labels.float())
