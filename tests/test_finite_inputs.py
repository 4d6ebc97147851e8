"""Finite or refused (issue 69): activations that float16 cannot hold or that are not finite
are refused before a row is stored, naming the layer and the images (data indices); an
autoencoder is not trained on rows holding NaN or inf; a steering strength or latent that is
not a number / an index is refused. Each message's fix is run."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

import vizkit as vk
from vizkit.sae import ablate, steer


def tiny(scale: float = 1.0) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                              num_classes=5).eval()  # fmt: skip
    with torch.no_grad():
        model.patch_embed.proj.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_a_float16_overflow_is_refused_before_it_is_stored(tmp_path, images):
    model = tiny(scale=1e5)  # the stream reaches about 1e6
    with pytest.raises(ValueError, match=r"blocks.1.hook_resid_post: an activation of .* exceeds "
                       r"float16's largest value 6.55e\+04.*dtype=torch.bfloat16"):  # fmt: skip
        vk.cache_activations(model, images, tmp_path / "h", dtype=torch.float16, progress=False)
    assert not list((tmp_path / "h" / "layer0").glob("*.bin"))  # nothing stored
    store = vk.cache_activations(model, images, tmp_path / "b", dtype=torch.bfloat16,
                                 progress=False)  # the fix  # fmt: skip
    rows = store.rows(0, len(store)).float()
    assert rows.isfinite().all() and rows.abs().max() > 65504


def test_non_finite_activations_are_refused_naming_the_data_indices(tmp_path, images):
    dirty = images.clone()
    dirty[7, 0, 3, 3] = float("nan")  # image 7: the fourth of the second batch of 4
    with pytest.raises(ValueError, match=r"images hold NaN values \(data indices \[7\]\)"):
        vk.cache_activations(tiny(), dirty, tmp_path / "s", batch_size=4, progress=False)
    broken = tiny()
    with torch.no_grad():
        broken.blocks[1].mlp.fc2.bias[0] = float("nan")  # finite images, NaN activations
    with pytest.raises(ValueError, match=r"blocks.1.hook_resid_post: the model's activations "
                       r"are not finite \(NaN or inf\) on images \[0, 1, 2, 3\]"):  # fmt: skip
        vk.cache_activations(broken, images, tmp_path / "n", batch_size=4, progress=False)


def test_an_autoencoder_is_not_trained_on_rows_holding_nan(tmp_path, images):
    rows = torch.randn(600, 16, generator=torch.Generator().manual_seed(0))
    rows[40, 3] = float("inf")
    with pytest.raises(ValueError, match=r"Row 40 holds NaN or inf"):
        vk.train_sae(rows, expansion=2, k=3, tokens=1024, batch_size=128, progress=False)
    clean = rows[rows.isfinite().all(1)]  # the fix the message gives
    sae = vk.train_sae(clean, expansion=2, k=3, tokens=1024, batch_size=128, progress=False)
    assert all(p.isfinite().all() for p in sae.parameters())

    store = vk.cache_activations(tiny(), images, tmp_path / "s", progress=False)
    file = tmp_path / "s" / "layer0" / "00000.bin"
    data = np.fromfile(file, np.float32)
    data[5 * 192 + 2] = np.nan  # row 5, in place: the size is right, so the store opens
    data.tofile(file)
    with pytest.raises(ValueError, match=rf"Row 5 of {tmp_path / 's'} \(blocks.1"):
        vk.train_sae(store.folder, expansion=2, k=3, tokens=256, batch_size=64, progress=False)


def test_a_steering_strength_or_latent_that_is_no_number_is_refused(images):
    model = tiny()
    sae = vk.sae.SparseAutoencoder(192, 384, "topk", 4, seed=0)
    sae.source = {"layer": "blocks.1.hook_resid_post", "tokens": "all"}
    for strength in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"strength must be a number in \[-inf, inf\]"):
            steer(model, sae, images[:2], 3, strength=strength)
    with pytest.raises(TypeError, match=r"latent must be an int in \[0, 383\]; got 1.5"):
        steer(model, sae, images[:2], 1.5, strength=1.0)
    with pytest.raises(TypeError, match=r"latents must be an int in \[0, 383\]; got 2.0"):
        ablate(model, sae, images[:2], [1, 2.0])
    with pytest.raises(ValueError, match="latents is empty"):
        ablate(model, sae, images[:2], [])


def test_the_feature_options_are_range_checked_before_any_work(tmp_path, images):
    model = tiny()
    store = vk.cache_activations(model, images[:4], tmp_path / "s", progress=False)
    sae = vk.train_sae(store, expansion=2, k=4, batch_size=16, tokens=160, progress=False)
    for top in (0, 1.5, float("nan")):
        with pytest.raises((TypeError, ValueError), match="top must be an int >= 1"):
            vk.sae.features(sae, store, top=top, progress=False)
    for image_bytes in (-1, 1.5):
        with pytest.raises((TypeError, ValueError), match="image_bytes must be an int >= 0"):
            vk.sae.features(sae, store, image_bytes=image_bytes, progress=False)
    for dense_above in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"dense_above must be a number in \[0, 1\)"):
            vk.sae.evaluate_sae(sae, store, dense_above=dense_above, progress=False)
    for latents in ([1.5], [float("nan")], [384]):
        with pytest.raises((TypeError, ValueError), match="latents"):
            vk.sae.latent_maps(model, sae, images[:2], latents=latents)
    for classes in ([1.5], [float("nan")], [5], []):
        with pytest.raises(ValueError, match=r"classes must be indices in 0..4"):
            vk.sae.logit_effects(model, sae, images[:2], classes=classes)
    last = vk.sae.latent_maps(model, sae, images[:2], latents=[-1])
    torch.testing.assert_close(last, vk.sae.latent_maps(model, sae, images[:2])[:, -1:])
