"""Grad-CAM against pytorch-grad-cam, and the captum wrappers against direct captum calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from captum.attr import IntegratedGradients, Occlusion, Saliency
from conftest import build, hooks_on, pass_budget
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

import vizkit as vk
from vizkit.datasets import load_sample


@pytest.fixture(scope="module")
def sample():
    x, labels, masks = load_sample()
    return x[:12], labels[:12], masks[:12]


def _pearson_per_map(ours: torch.Tensor, theirs: np.ndarray) -> list[float]:
    values = []
    for a, b in zip(ours.flatten(1).numpy(), theirs.reshape(len(theirs), -1), strict=True):
        if a.std() == 0 or b.std() == 0:  # an all-zero map: both must be constant
            assert a.std() == 0 and b.std() == 0
            continue
        values.append(float(np.corrcoef(a, b)[0, 1]))
    return values


def test_vit_gradcam_equals_pytorch_grad_cam(sample):
    x, labels, _ = sample
    model, _ = vk.zoo.load("vit_tiny_shapes")
    ours = vk.gradcam(model, x, target=labels)
    assert ours.options["layer"] == f"blocks.{len(model.blocks) - 1}.hook_resid_pre"
    layout = ours.layout

    def reshape(tokens):  # (B, N, C) -> (B, C, gh, gw), the layout vizkit resolves
        patches = tokens[:, layout.num_prefix_tokens :]
        return patches.reshape(len(tokens), *layout.grid, -1).permute(0, 3, 1, 2)

    # the input of the last block is the output of the one before it
    with GradCAM(model, target_layers=[model.blocks[-2]], reshape_transform=reshape) as cam:
        theirs = cam(x, targets=[ClassifierOutputTarget(int(t)) for t in labels])
    correlations = _pearson_per_map(ours.upsample(), theirs)
    assert len(correlations) >= len(x) // 2
    assert min(correlations) >= 0.999
    assert hooks_on(model) == []


def test_cnn_gradcam_equals_pytorch_grad_cam(sample):
    x, labels, _ = sample
    model, _ = vk.zoo.load("resnet_tiny_shapes")
    ours = vk.gradcam(model, x, target=labels)
    assert ours.options["layer"] == "layer4.hook_out"
    with GradCAM(model, target_layers=[model.layer4]) as cam:
        theirs = cam(x, targets=[ClassifierOutputTarget(int(t)) for t in labels])
    correlations = _pearson_per_map(ours.upsample(), theirs)
    assert len(correlations) >= len(x) // 2
    assert min(correlations) >= 0.999


def test_gradcam_defaults_and_warnings():
    model, x = build("vit_reg_avg")  # average pooling: the last block's output
    assert vk.gradcam(model, x).options["layer"].endswith("hook_resid_post")
    model, x = build("cait")
    assert vk.gradcam(model, x).options["layer"] == "blocks.1.hook_resid_post"
    model, x = build("vit")
    last = f"blocks.{len(model.blocks) - 1}.hook_resid_post"  # patch tokens never reach the head
    with pytest.warns(UserWarning, match="gradients at .* are zero"):
        vk.gradcam(model, x, layer=last)
    with pytest.raises(ValueError, match="out of range"):
        vk.gradcam(model, x, target=10**6)
    with pytest.raises(ValueError, match="token activation"):
        vk.gradcam(model, x, layer="blocks.0.attn.hook_pattern")


def test_gradcam_targets_and_batch():
    model, x = build("deit_distilled")
    both = vk.gradcam(model, x, target=[2, 5])
    assert both.targets.tolist() == [2, 5]
    single = vk.gradcam(model, x[1:], target=5)
    torch.testing.assert_close(both.maps[1:], single.maps, rtol=1e-4, atol=1e-6)
    callable_target = vk.gradcam(model, x, target=lambda out: out[:, 2] - out[:, 5])
    assert callable_target.targets is None


@pytest.mark.parametrize("key", ["vit", "resnet"])
def test_captum_wrappers_equal_direct_calls(key):
    model, x = build(key)
    target = torch.tensor([1, 4])
    ig = vk.integrated_gradients(model, x, target=target, n_steps=16)
    direct = IntegratedGradients(model).attribute(
        x, baselines=0.0, target=target, n_steps=16, internal_batch_size=8
    )
    torch.testing.assert_close(ig.maps, direct.sum(1).detach(), rtol=1e-4, atol=1e-6)
    sal = vk.saliency(model, x, target=target)
    direct = Saliency(model).attribute(x.clone().requires_grad_(True), target=target)
    torch.testing.assert_close(sal.maps, direct.amax(1), rtol=1e-5, atol=1e-7)
    occ = vk.occlusion(model, x, target=target, window=16)
    direct = Occlusion(model).attribute(
        x, sliding_window_shapes=(3, 16, 16), strides=(3, 16, 16), baselines=0.0, target=target
    )
    torch.testing.assert_close(occ.maps, direct.mean(1), rtol=1e-4, atol=1e-6)
    assert ig.targets.tolist() == [1, 4] and ig.maps.shape == x.shape[:1] + x.shape[2:]


@pytest.mark.parametrize(
    ("window", "stride", "baseline"), [((12, 12), (8, 8), 0.5), ((64, 5), (1, 4), -1.0)]
)
def test_occlusion_equals_captum_where_windows_overlap_and_are_cut_at_the_edge(
    window, stride, baseline
):
    """vizkit's occlusion (its own passes, one (B, H, W) sum) against captum's Occlusion:
    overlapping windows, a last window cut at the image's edge, a window as tall as the image,
    a baseline other than zero, class logits and a score target per image."""
    model, x = build("vit")
    target = torch.tensor([1, 4])
    ours = vk.occlusion(model, x, target=target, window=window, stride=stride, baseline=baseline)
    direct = Occlusion(model).attribute(
        x, sliding_window_shapes=(3, *window), strides=(3, *stride), baselines=baseline,
        target=target,
    )  # fmt: skip
    torch.testing.assert_close(ours.maps, direct.mean(1), rtol=1e-4, atol=1e-6)
    weights = torch.linspace(-1, 1, model.num_classes)

    def score(output):
        return output @ weights

    by_score = vk.occlusion(model, x, target=score, window=window, stride=stride,
                            baseline=baseline)  # fmt: skip
    direct = Occlusion(lambda images: score(model(images))).attribute(
        x, sliding_window_shapes=(3, *window), strides=(3, *stride), baselines=baseline,
    )  # fmt: skip
    torch.testing.assert_close(by_score.maps, direct.mean(1), rtol=1e-4, atol=1e-5)


def test_occlusion_refuses_a_stride_that_skips_pixels():
    model, x = build("vit")
    with pytest.raises(ValueError, match=r"stride \(9, 9\) is larger than the window"):
        vk.occlusion(model, x, window=8, stride=9)
    assert vk.occlusion(model, x, window=8, stride=8).maps.shape == (2, 64, 64)


def test_occlusion_keeps_a_batch_below_the_image_count():
    model, x = build("vit")
    whole = vk.occlusion(model, x, target=[1, 4], window=16)
    sizes, one_image = [], pass_budget(model, x, 1, gradients=False)
    handle = model.register_forward_pre_hook(lambda module, args: sizes.append(len(args[0])))
    try:
        split = vk.occlusion(model, x, target=[1, 4], window=16, max_bytes=one_image)
    finally:
        handle.remove()
    assert max(sizes[1:]) == 1  # after the forward that resolves targets
    torch.testing.assert_close(split.maps, whole.maps, rtol=1e-4, atol=1e-6)


def test_integrated_gradients_keeps_a_batch_below_the_image_count():
    """captum raises an internal batch below B to B; vizkit splits the images instead, so no
    pass holds more images than max_bytes allows, and the maps are the same."""
    model, x = build("vit")
    target, start = torch.tensor([1, 4]), torch.randn_like(x)
    whole = vk.integrated_gradients(model, x, target=target, baseline=start, n_steps=6)
    sizes, one_image = [], pass_budget(model, x, 1, gradients=True)
    handle = model.register_forward_pre_hook(lambda module, args: sizes.append(len(args[0])))
    try:
        split = vk.integrated_gradients(
            model, x, target=target, baseline=start, n_steps=6, max_bytes=one_image
        )
    finally:
        handle.remove()
    assert sizes[2:] == [1] * 12  # after the targets' forward and the one image measured
    torch.testing.assert_close(split.maps, whole.maps, rtol=1e-4, atol=1e-6)
    by_callable = vk.integrated_gradients(
        model, x, target=lambda out: out[:, 1], n_steps=6, max_bytes=one_image
    )
    assert by_callable.maps.shape == whole.maps.shape and by_callable.targets is None


def test_occlusion_window_defaults_to_the_patch():
    model, x = build("vit")
    assert vk.occlusion(model, x).options["window"] == tuple(model.patch_embed.patch_size)
