"""The store passes' sparse codes (`vizkit.sae.sparse_latents`) against the dense encoder and
decoder, for every kind of autoencoder, and `evaluate_sae` and `features` of a BatchTopK and a
ReLU autoencoder against brute force over the dense latents."""

from __future__ import annotations

import pytest
import torch
from test_sae import random_sae
from test_sae_features import all_latents

import vizkit as vk
from vizkit.sae import evaluate_sae
from vizkit.sae.latent_stats import features
from vizkit.sae.sparse_latents import sparse_latents


def trained_threshold(sae):
    """A BatchTopK (or Matryoshka) autoencoder's theta, as training would set it."""
    with torch.no_grad():
        sae.threshold.fill_(0.8)
    return sae.eval()


KINDS = {
    "topk": lambda: random_sae("topk", 4).eval(),
    "batchtopk": lambda: trained_threshold(random_sae("batchtopk", 4)),
    "matryoshka": lambda: trained_threshold(random_sae("matryoshka", 4)),
    "relu": lambda: random_sae("relu", None).eval(),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_sparse_code_and_its_reconstruction_equal_the_dense_ones(kind):
    sae = KINDS[kind]()
    x = torch.randn(300, sae.width, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        z, x_hat = sae.encode(x), sae(x)
        code = sparse_latents(sae, x)
        assert int((z > 0).sum()) > 0
        torch.testing.assert_close(code.dense(sae.latents), z, rtol=0, atol=0)
        assert bool((code.row[1:] >= code.row[:-1]).all())
        scale = float(x_hat.abs().max())
        torch.testing.assert_close(code.decode(sae), x_hat, rtol=0, atol=1e-5 * scale)
        torch.testing.assert_close(code.image_max(3, sae.latents),
                                   z.view(100, 3, -1).amax(1), rtol=0, atol=0)  # fmt: skip
        torch.testing.assert_close(code.fired(sae.latents), (z != 0).sum(0).double())


def test_a_row_with_no_latent_on_decodes_to_the_bias():
    sae = KINDS["batchtopk"]()
    with torch.no_grad():
        sae.threshold.fill_(1e9)  # nothing fires
        x = torch.randn(5, sae.width)
        code = sparse_latents(sae, x)
        assert len(code.value) == 0
        torch.testing.assert_close(code.decode(sae), sae(x))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    import test_sae_features

    model = test_sae_features.tiny_vit()
    images = torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    folder = tmp_path_factory.mktemp("sparse")
    return vk.cache_activations(model, images, folder / "s", layers=[-1], tokens="all",
                                progress=False)  # fmt: skip


@pytest.mark.parametrize("kind", ["batchtopk", "relu"])
def test_store_passes_of_other_kinds_equal_brute_force(stored, kind):
    k = None if kind == "relu" else 6
    sae = vk.train_sae(stored, kind=kind, expansion=2, k=k, tokens=10 * len(stored),
                       batch_size=128, progress=False)  # fmt: skip
    z = all_latents(sae, stored)
    found = features(sae, stored, top=4, progress=False)
    torch.testing.assert_close(found.density, (z > 0).float().mean(0))
    torch.testing.assert_close(found.top_values, z.T.topk(4, dim=1).values)
    for latent in range(0, sae.latents, 7):
        largest = z[:, latent].topk(4).values
        for (image, token, value), want in zip(found.top_patches(latent), largest, strict=False):
            assert value == pytest.approx(float(want), rel=1e-6)
            assert float(z[image * 17 + token, latent]) == pytest.approx(value, rel=1e-6)
    torch.testing.assert_close(found.image_max, z.view(24, 17, -1).amax(1))
    scores = evaluate_sae(sae, stored, batch_size=100, progress=False)
    rows = stored.rows(0, len(stored))
    with torch.no_grad():
        error = ((sae(rows) - rows) ** 2).sum()
    assert scores.fvu == pytest.approx(float(error / ((rows - rows.mean(0)) ** 2).sum()), rel=1e-5)
    assert scores.l0 == pytest.approx(float((z > 0).sum(1).float().mean()), rel=1e-6)
    torch.testing.assert_close(scores.density, (z > 0).float().mean(0))
