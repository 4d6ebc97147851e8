"""Methods that run many copies of a batch size their passes by a budget in bytes
(`vizkit.hooks.passes`): one image's pass is measured exactly (against the profiler's
allocation events), each method's passes hold no more images than ``max_bytes`` allows (the
batch's own size by default, not copies x batch), the maps do not depend on the budget, and a
budget below one image is refused with a fix that works. SmoothGrad and GradientSHAP, which
vizkit now runs itself, agree with captum's estimators."""

from __future__ import annotations

import functools
import re

import pytest
import timm
import torch
from allocation_oracle import allocated_peak
from conftest import pass_budget
from torch import nn

import vizkit as vk
from vizkit.hooks import passes
from vizkit.hooks.passes import images_per_pass, one_image_bytes, peak_bytes

# method -> (its copies run a backward, its options)
MULTI_COPY = {
    "smoothgrad": (True, {"samples": 3}),
    "gradientshap": (True, {"samples": 3}),
    "integrated_gradients": (True, {"n_steps": 3}),
    "occlusion": (False, {}),
    "scorecam": (False, {}),
    "ablationcam": (False, {}),
    "smoothed": (True, {"samples": 3}),  # smoothed("gradcam", ...): any method's copies
}


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=8, depth=2,
                              num_classes=5).eval()  # fmt: skip
    return model, torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("gradients", [False, True])
def test_one_image_is_measured_as_the_allocator_sees_it(vit, gradients):
    model, x = vit
    image = x[:1].clone().requires_grad_(gradients)

    def run():
        _pass(model, image, gradients)

    run()  # lazily built buffers
    assert peak_bytes(run) == allocated_peak(run) > 0
    copy = x[0].nbytes  # a pass holds the image's copy beside what the model holds on it
    assert one_image_bytes(model, x, gradients) == pytest.approx(peak_bytes(run) + copy, rel=1e-3)
    four = x.clone().requires_grad_(gradients)
    four_images = allocated_peak(lambda: _pass(model, four, gradients))
    per_image = one_image_bytes(model, x, gradients) - copy
    assert per_image * 4 == pytest.approx(four_images, rel=1e-3)
    own = images_per_pass(model, x, None, gradients, "m")  # copies and pass within the batch's
    assert own == 4 * per_image // (per_image + copy) and (per_image + copy) * own <= four_images


def _pass(model: nn.Module, x: torch.Tensor, gradients: bool) -> None:
    """A pass as the methods run it: parameters frozen, the gradient to the images."""
    with vk.hooks.frozen_parameters(model):
        if gradients:
            torch.autograd.grad(model(x).sum(), x)
        else:
            with torch.no_grad():
                model(x)


def _passes(model: nn.Module, method: str, x: torch.Tensor, **options) -> tuple[list[int], object]:
    """The images each call of the last block saw (every pass, also Ablation-CAM's resumed
    ones), and the result."""
    sizes = []
    handle = model.blocks[-1].register_forward_pre_hook(lambda m, args: sizes.append(len(args[0])))
    try:
        run = functools.partial(vk.smoothed, "gradcam") if method == "smoothed" else None
        result = (run or getattr(vk, method))(model, x, target=[0, 1, 2, 3], **options)
    finally:
        handle.remove()
    return sizes, result


@pytest.mark.parametrize("method", list(MULTI_COPY))
def test_passes_hold_what_the_budget_allows_and_the_maps_do_not_change(vit, method):
    model, x = vit
    gradients, options = MULTI_COPY[method]
    default, reference = _passes(model, method, x, **options)
    assert max(default) <= len(x)  # the batch's own size, not copies x batch
    budget = pass_budget(model, x, 3, gradients)
    sizes, budgeted = _passes(model, method, x, max_bytes=budget, **options)
    copies = [s for s in sizes if s <= 3]
    assert set(sizes) - set(copies) <= {len(x)}  # else only the batch itself
    assert len(copies) > len(sizes) - len(copies) and max(copies) == 3
    torch.testing.assert_close(budgeted.maps, reference.maps, rtol=1e-4, atol=1e-6)


def test_a_budget_below_one_image_is_refused_with_a_fix_that_works(vit):
    model, x = vit
    one_image = one_image_bytes(model, x, gradients=True)
    with pytest.raises(ValueError, match="One image's pass of smoothgrad holds") as refused:
        vk.smoothgrad(model, x, target=0, samples=2, max_bytes=one_image - 1)
    fix = int(re.search(r"Pass max_bytes=(\d+) or more", str(refused.value)).group(1))
    result = vk.smoothgrad(model, x, target=0, samples=2, max_bytes=fix)
    assert result.options["images_per_pass"] == 1
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1"):
        vk.scorecam(model, x, target=0, max_bytes=0)


def test_on_cuda_passes_fit_the_free_memory(vit, monkeypatch):
    """The device's free memory caps the default and a given budget (a CPU stand-in for the
    CUDA query); a device too full for one image names the cause, not max_bytes."""
    model, x = vit
    per_image = one_image_bytes(model, x, gradients=True)
    monkeypatch.setattr(passes, "available_bytes", lambda device: 10 * per_image)
    assert images_per_pass(model, x, None, True, "m") == 9  # 90 % of 10 images' worth
    assert images_per_pass(model, x, 2 * per_image, True, "m") == 2
    monkeypatch.setattr(passes, "available_bytes", lambda device: per_image // 2)
    with pytest.raises(ValueError, match=r"MiB free on cpu\. Free device memory"):
        images_per_pass(model, x, None, True, "m")


def _small_net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 3)).eval()  # fmt: skip


def test_smoothgrad_and_gradientshap_agree_with_captums_estimators():
    """Means over 2000 copies, vizkit's draws against captum's: within 6 standard errors of
    their difference (captum's own variance of the same attributions, `vargrad`)."""
    from captum.attr import GradientShap, NoiseTunnel, Saliency

    model, n = _small_net(), 2000
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(4))
    base = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(5))
    ours = vk.smoothgrad(model, x, target=[0, 2], samples=n, noise=0.2).maps
    stdev = 0.2 * float(x.max() - x.min())
    tunnel = NoiseTunnel(Saliency(model))
    torch.manual_seed(0)
    kwargs = {"target": [0, 2], "nt_samples": n, "stdevs": stdev, "abs": True}
    theirs = tunnel.attribute(x, nt_type="smoothgrad", **kwargs)
    variance = tunnel.attribute(x, nt_type="vargrad", **kwargs)
    _assert_within(ours, theirs.abs().amax(1), variance.amax(1), n)

    ours = vk.gradientshap(model, x, target=[0, 2], baselines=base, samples=n, noise=0.1).maps
    torch.manual_seed(0)
    theirs = GradientShap(model).attribute(x, baselines=base, target=[0, 2], n_samples=n,
                                           stdevs=0.1).sum(1)  # fmt: skip
    spread = _gradientshap_variance(model, x, base, n)
    _assert_within(ours, theirs, spread, n)


def _gradientshap_variance(model: nn.Module, x, base, n: int) -> torch.Tensor:
    """(B, H, W) the variance of one copy's channel-summed GradientSHAP attribution, from
    captum's own draws (its NoiseTunnel over its baseline-times-gradient step)."""
    from captum.attr import NoiseTunnel
    from captum.attr._core.gradient_shap import InputBaselineXGradient

    tunnel = NoiseTunnel(InputBaselineXGradient(model))
    torch.manual_seed(1)
    per_channel = tunnel.attribute(x, nt_type="vargrad", nt_samples=n, stdevs=0.1,
                                   draw_baseline_from_distrib=True, baselines=base,
                                   target=[0, 2])  # fmt: skip
    return per_channel.sum(1) * x.shape[1]  # a bound: var(sum) <= C * sum(var)


def _assert_within(ours, theirs, variance, n: int) -> None:
    error = (ours - theirs).abs()
    bound = 6 * (2 * variance.clamp_min(0) / n).sqrt() + 1e-6
    assert (error <= bound).all(), float((error / bound).max())


class _HalfSquaredNorm(nn.Module):
    """f(x) = |x|^2 / 2 per image, as (B, 1) logits: its gradient is x itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x.flatten(1).square().sum(1, keepdim=True)


def test_gradientshap_of_a_quadratic_has_its_closed_form():
    """With a black baseline, a copy's attribution is x' * alpha x' (x' = x + noise), whose
    mean is E[alpha] E[x'^2] = (x^2 + s^2) / 2: the noise enters the difference to the
    baseline as well as the point (captum's definition)."""
    x = torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(6))
    n, s = 5000, 0.8
    ours = vk.gradientshap(_HalfSquaredNorm(), x, target=0, baselines=torch.zeros(1, 3, 2, 2),
                           samples=n, noise=s).maps  # fmt: skip
    expected = ((x.square() + s**2) / 2).sum(1)
    torch.testing.assert_close(ours, expected, rtol=0.03, atol=0.03)


def test_curves_on_cuda_take_passes_by_the_budget(vit, monkeypatch):
    """Deletion, insertion and the other perturbation metrics: on CUDA the memory budget
    sizes their passes (a CPU stand-in for the CUDA query), on the CPU the pixel budget."""
    from vizkit.metrics import faithfulness

    model, x = vit
    per_image = one_image_bytes(model, x, gradients=False)
    assert faithfulness.batch_images(None, x, model) == faithfulness.BATCH_PIXELS // 64**2
    monkeypatch.setattr(faithfulness, "available_bytes", lambda device: 10 * per_image)
    monkeypatch.setattr(passes, "available_bytes", lambda device: 10 * per_image)
    assert faithfulness.batch_images(None, x, model) == 9
    assert faithfulness.batch_images(5, x, model) == 5


def test_inside_the_callers_no_grad_the_gradient_methods_still_run(vit):
    """SmoothGrad and GradientSHAP (no longer captum's, which turned gradients on) and the
    one-image measure take their gradients inside a caller's ``torch.no_grad()``."""
    model, x = vit
    expected = vk.smoothgrad(model, x[:2], target=1, samples=2).maps
    with torch.no_grad():
        torch.testing.assert_close(vk.smoothgrad(model, x[:2], target=1, samples=2).maps, expected)
        vk.gradientshap(model, x[:2], target=1, samples=2)
        budget = pass_budget(model, x, 1, gradients=True)
        vk.integrated_gradients(model, x[:2], target=1, n_steps=2, max_bytes=budget)
    assert budget == pass_budget(model, x, 1, gradients=True)


def test_tensors_without_a_plain_storage_are_not_counted():
    """Sparse tensors (and wrapper subclasses) have no storage to read: skipped, not a crash."""
    sparse = torch.eye(4).to_sparse()
    assert peak_bytes(lambda: torch.sparse.mm(sparse, torch.ones(4, 2))) > 0
