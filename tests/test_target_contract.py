"""One target contract for every registered method: a class index, one per image, a callable
with one column or several (summed per image, as `target_score` sums them), and a
`vizkit.targets` helper, with the map shape checked and the sum rule held; the noise methods
on bfloat16 and float16 models."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch

import vizkit as vk

METHODS = sorted(vk.methods.METHODS)


@pytest.fixture(scope="module")
def model_and_images():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32,
                              patch_size=8, depth=2).eval()  # fmt: skip
    return model, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _maps(name, model, x, target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vk.methods.METHODS[name](model, x, target=target).maps


@pytest.mark.parametrize("name", METHODS)
def test_every_kind_of_target_follows_one_contract(name, model_and_images):
    model, x = model_and_images
    by_index = _maps(name, model, x, 3)
    assert by_index.shape[0] == 2 and by_index.ndim == 3
    close = {"rtol": 1e-4, "atol": 1e-6}
    torch.testing.assert_close(_maps(name, model, x, lambda out: out[:, 3]), by_index, **close)
    summed = _maps(name, model, x, lambda out: out[:, 3] + out[:, 5])
    torch.testing.assert_close(_maps(name, model, x, lambda out: out[:, [3, 5]]), summed, **close)
    per_image = _maps(name, model, x, [3, 5])
    torch.testing.assert_close(per_image[0], by_index[0], **close)
    torch.testing.assert_close(per_image[1], _maps(name, model, x, 5)[1], **close)
    logit_3 = vk.targets.direction(torch.eye(10)[3])  # the logits as an embedding
    torch.testing.assert_close(_maps(name, model, x, logit_3), by_index, **close)


@pytest.mark.parametrize("name", [name for name in METHODS if vk.methods.METHODS[name].targets])
def test_a_target_without_a_batch_axis_is_refused(name, model_and_images):
    """out[0] scores image 0 only: taken as every image's score, the other images' maps would
    be zero (or image 0's), so every method refuses it, gradient methods included."""
    model, x = model_and_images
    for wrong in (lambda out: out[0], lambda out: out[0, :3], lambda out: out.sum()):
        with pytest.raises(ValueError, match="score per image"):
            _maps(name, model, x, wrong)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["smoothgrad", "gradientshap", "integrated_gradients"])
def test_noise_and_path_methods_run_on_half_precision_models(name, dtype, model_and_images):
    model, x = model_and_images
    half = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8,
                             depth=2).eval()  # fmt: skip
    half.load_state_dict(model.state_dict())
    maps = _maps(name, half.to(dtype), x.to(dtype), 3)
    assert maps.shape == (2, 32, 32) and bool(torch.isfinite(maps).all())
