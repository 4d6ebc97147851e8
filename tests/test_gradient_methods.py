"""SmoothGrad and GradientSHAP (captum, batched): exact on a linear model, where both have a
closed form, and SmoothGrad with vanishing noise equal to the plain input gradient; both run on
ViT-family models and refuse bad options."""

from __future__ import annotations

import pytest
import torch
from conftest import build, pass_budget
from torch import nn

import vizkit as vk


def linear_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 5)).eval()


def test_smoothgrad_of_a_linear_model_is_its_weight_magnitude():
    """|d f_k / d x| is |w_k| whatever the noise, so every noisy copy gives the same map."""
    model, x = linear_model(), torch.randn(2, 3, 8, 8)
    result = vk.smoothgrad(
        model, x, target=[1, 3], samples=5, max_bytes=pass_budget(model, x, 3, True)
    )
    weights = model[1].weight.detach().view(5, 3, 8, 8).abs().amax(1)
    torch.testing.assert_close(result.maps, weights[[1, 3]])
    assert result.options["samples"] == 5


def test_smoothgrad_without_noise_is_the_input_gradient():
    model, x = build("vit")
    x = x[:2]
    smooth = vk.smoothgrad(model, x, target=1, samples=2, noise=1e-9)
    plain = vk.saliency(model, x, target=1)
    torch.testing.assert_close(smooth.maps, plain.maps, rtol=1e-3, atol=1e-6)


def test_gradientshap_of_a_linear_model_is_the_difference_times_the_weight():
    """For f = w x + b, every sampled point has gradient w: the attribution is (x - b) w."""
    model, x = linear_model(), torch.randn(2, 3, 8, 8)
    base = torch.randn(1, 3, 8, 8)
    result = vk.gradientshap(model, x, target=2, baselines=base, samples=4)
    weight = model[1].weight.detach()[2].view(3, 8, 8)
    torch.testing.assert_close(result.maps, ((x - base) * weight).sum(1), rtol=1e-5, atol=1e-6)


def test_both_run_on_vit_families_and_refuse_bad_options():
    model, x = build("vit")
    for method in (vk.smoothgrad, vk.gradientshap):
        result = method(model, x[:2], target=0, samples=2)
        assert result.maps.shape == (2, *x.shape[-2:]) and torch.isfinite(result.maps).all()
    with pytest.raises(ValueError, match="noise"):
        vk.smoothgrad(model, x[:1], noise=-0.1)
    with pytest.raises(ValueError, match="baselines must be"):
        vk.gradientshap(model, x[:1], baselines=torch.zeros(1, 3, 8, 8))


def test_smoothed_averages_any_method_over_noisy_copies():
    model, x = build("vit")
    x = x[:2]
    plain = vk.gradcam(model, x, target=1)
    quiet = vk.smoothed("gradcam", model, x, target=1, samples=2, noise=0.0)
    torch.testing.assert_close(quiet.maps, plain.maps)  # no noise: the method itself
    a = vk.smoothed("gradcam_pp", model, x, target=1, samples=3, noise=0.2, seed=4)
    b = vk.smoothed("gradcam_pp", model, x, target=1, samples=3, noise=0.2, seed=4)
    torch.testing.assert_close(a.maps, b.maps)  # seeded
    assert a.method == "gradcam_pp (smoothed)" and a.options["samples"] == 3
    assert not torch.allclose(a.maps, vk.gradcam_pp(model, x, target=1).maps)
    linear = linear_model()  # |w| whatever the noise: smoothing changes nothing
    torch.testing.assert_close(
        vk.smoothed("saliency", linear, torch.randn(2, 3, 8, 8), target=2, samples=4).maps,
        linear[1].weight.detach()[2].view(3, 8, 8).abs().amax(0).expand(2, 8, 8),
    )
    with pytest.raises(KeyError, match="Unknown saliency method 'nope'"):
        vk.smoothed("nope", model, x)


def test_smoothed_saliency_is_smoothgrad_one_noise_for_both():
    """On one-channel images the saliency map is |gradient| (no channel to take the max over),
    so smoothing it is SmoothGrad: equal only if both draw the same noisy copies, whatever
    the passes (noise 0: the input gradient itself, in both)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Flatten(),
                          nn.Linear(4 * 8 * 8, 3)).eval()  # fmt: skip
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    for noise in (0.3, 0.0):
        smooth = vk.smoothgrad(model, x, target=1, samples=4, noise=noise, seed=5)
        each = vk.smoothed("saliency", model, x, target=1, samples=4, noise=noise, seed=5,
                           max_bytes=pass_budget(model, x, 5, True))  # fmt: skip
        torch.testing.assert_close(each.maps, smooth.maps, rtol=1e-5, atol=1e-7)
    plain = vk.saliency(model, x, target=1).maps
    torch.testing.assert_close(each.maps, plain, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(vk.smoothed("saliency", model, x, target=1, noise=0.3).maps, plain)


@pytest.mark.parametrize("method", [vk.smoothgrad, vk.gradientshap])
def test_noise_comes_from_the_seed_and_the_callers_random_state_is_kept(method):
    """captum draws from torch's and NumPy's global generators: the method seeds them for the
    call and restores them, so two calls agree and the caller's next draws are unchanged."""
    import numpy as np

    model, x = build("vit")
    torch.manual_seed(123)
    np.random.seed(123)
    expected = torch.rand(3), np.random.rand(3)
    torch.manual_seed(123)
    np.random.seed(123)
    first = method(model, x, target=1, samples=4, seed=5).maps
    assert torch.equal(torch.rand(3), expected[0]) and (np.random.rand(3) == expected[1]).all()
    torch.testing.assert_close(method(model, x, target=1, samples=4, seed=5).maps, first)
    assert not torch.equal(method(model, x, target=1, samples=4, seed=6).maps, first)
