"""Dense outputs (issue 74): the targets of `vizkit.targets.dense` equal the model's output reduced
by hand, transformers' DPT (depth and segmentation, random-init small configs) is a family whose
maps equal its own, Grad-CAM of a segmentation class equals pytorch-grad-cam's with its
``SemanticSegmentationTarget`` on the same layer, and a class index on a dense output is refused
with helpers that work."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")


def dpt(head: str) -> nn.Module:
    """A small random-init DPT (32 px, 8 px patches, 4 blocks): 3 classes or depth, at twice the
    input's resolution (64 x 64)."""
    torch.manual_seed(0)
    config = transformers.DPTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=64, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 32],
        fusion_hidden_size=16, num_labels=3,
    )  # fmt: skip
    cls = transformers.DPTForSemanticSegmentation if head == "segmentation" else (
        transformers.DPTForDepthEstimation
    )  # fmt: skip
    return cls(config).eval()


def depth_anything() -> nn.Module:
    """A small random-init Depth Anything: a DINOv2 backbone (32 px, 8 px patches, 4 blocks)
    read at its four layers by the DPT-style decoder, depth at 32 x 32."""
    torch.manual_seed(0)
    backbone = transformers.Dinov2Config(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=64, out_indices=[1, 2, 3, 4], reshape_hidden_states=False,
    )  # fmt: skip
    config = transformers.DepthAnythingConfig(
        backbone_config=backbone, reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 32, 32],
        fusion_hidden_size=16, head_hidden_size=8, patch_size=8,
    )  # fmt: skip
    return transformers.DepthAnythingForDepthEstimation(config).eval()


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def square(size: int = 32, low: int = 8, high: int = 24) -> torch.Tensor:
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[low:high, low:high] = True
    return mask


def test_segmentation_targets_equal_the_logits_reduced_by_hand():
    logits = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    mask = square(8, 2, 5)
    torch.testing.assert_close(
        vk.targets.segment(1, mask)(logits), logits[:, 1, 2:5, 2:5].sum((1, 2))
    )
    wins = logits.argmax(1) == 2
    torch.testing.assert_close(vk.targets.segment(2)(logits), (logits[:, 2] * wins).sum((1, 2)))
    assert vk.targets.pixel(0, 3, 4)(logits).tolist() == logits[:, 0, 3, 4].tolist()
    # a mask at the image's size: the logits resized to it (bilinear), as post-processing does
    up = F.interpolate(logits, size=(32, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(
        vk.targets.segment(1, square())(logits), up[:, 1, 8:24, 8:24].sum((1, 2))
    )
    torch.testing.assert_close(vk.targets.pixel(1, 20, 9, size=(32, 32))(logits), up[:, 1, 20, 9])
    # one mask per image follows the rows a method scores (perturbed copies of image 1)
    masks = torch.stack([square(8, 0, 2), square(8, 4, 8)])
    target = vk.targets.segment(0, masks)
    assert target.per_image
    torch.testing.assert_close(
        target(logits[[1, 1]], rows=1), logits[[1, 1], 0, 4:8, 4:8].sum((1, 2))
    )
    outputs = transformers.modeling_outputs.SemanticSegmenterOutput(logits=logits)
    torch.testing.assert_close(
        vk.targets.segment(1, mask)(outputs), logits[:, 1, 2:5, 2:5].sum((1, 2))
    )


def test_depth_targets_equal_the_depth_reduced_by_hand():
    depth = torch.rand(2, 16, 16, generator=torch.Generator().manual_seed(2))
    near, far = square(16, 0, 4), square(16, 8, 16)
    torch.testing.assert_close(vk.targets.depth_region(near)(depth), depth[:, :4, :4].mean((1, 2)))
    expected = depth[:, :4, :4].mean((1, 2)) - depth[:, 8:, 8:].mean((1, 2))
    torch.testing.assert_close(vk.targets.depth_difference(near, far)(depth), expected)
    output = transformers.modeling_outputs.DepthEstimatorOutput(predicted_depth=depth)
    torch.testing.assert_close(vk.targets.depth_region(near)(output), depth[:, :4, :4].mean((1, 2)))
    box = vk.targets.box_mask((0, 0, 4, 4), (16, 16))
    assert torch.equal(box, near)


def test_dense_targets_refuse_what_they_cannot_read():
    with pytest.raises(ValueError, match="selects no pixel"):
        vk.targets.segment(0, torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"per-pixel class logits \(B, K, h, w\).*depth_region"):
        vk.targets.segment(0)(torch.rand(2, 8, 8))
    with pytest.raises(ValueError, match=r"per-pixel depth.*segment\(class, mask\)"):
        vk.targets.depth_region(square(8, 0, 2))(torch.rand(2, 3, 4, 8, 8))
    with pytest.raises(ValueError, match="class 5 is out of range"):
        vk.targets.segment(5)(torch.rand(1, 3, 4, 4))
    with pytest.raises(ValueError, match=r"outside the 4 x 4 output; give size="):
        vk.targets.pixel(0, 9, 0)(torch.rand(1, 3, 4, 4))
    with pytest.raises(ValueError, match="must lie inside"):
        vk.targets.box_mask((0, 0, 40, 4), (16, 16))


@pytest.mark.parametrize("head", ["segmentation", "depth", "depth_anything"])
def test_dense_models_attention_equals_their_own(head):
    model, x = (depth_anything() if head == "depth_anything" else dpt(head)), images()
    result = vk.attention(model, x)
    assert result.layout.grid == (4, 4) and result.layout.num_prefix_tokens == 1
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        own = torch.stack(model(x, output_attentions=True).attentions)
    model.config._attn_implementation = "sdpa"
    torch.testing.assert_close(result.patterns, own, rtol=1e-5, atol=1e-6)


def test_gradcam_of_a_segmentation_class_equals_pytorch_grad_cam():
    """pytorch-grad-cam's SemanticSegmentationTarget: class 1's logits summed over a mask of
    the output (64 x 64 here), at the output of the third block (the input of the fourth,
    vizkit's name), patch tokens reshaped onto the grid by hand."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    model, x = dpt("segmentation"), images(3)
    mask = square(64, 16, 48)
    ours = vk.gradcam(
        model, x, target=vk.targets.segment(1, mask), layer="dpt.encoder.layer.3.hook_resid_pre"
    )

    class Logits(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, images):
            return self.inner(images).logits

    def reshape(tokens):  # (B, 1 + 16, C) -> (B, C, 4, 4)
        return tokens[:, 1:].reshape(len(tokens), 4, 4, -1).permute(0, 3, 1, 2)

    wrapped = Logits(model)
    targets = [SemanticSegmentationTarget(1, mask.float().numpy())] * len(x)
    with GradCAM(
        wrapped, target_layers=[model.dpt.encoder.layer[2]], reshape_transform=reshape
    ) as cam:
        theirs = cam(x, targets=targets)  # min-max scaled, resized to 32 x 32
    for a, b in zip(ours.upsample().flatten(1).numpy(), theirs.reshape(len(x), -1), strict=True):
        assert a.std() > 0 and np.corrcoef(a, b)[0, 1] > 0.999


@pytest.mark.parametrize("head", ["segmentation", "depth", "depth_anything"])
def test_class_targets_on_dense_outputs_are_refused_with_a_fix_that_works(head):
    model, x = (depth_anything() if head == "depth_anything" else dpt(head)), images()
    with pytest.raises(
        ValueError, match=r"returns a map per image.*vk\.targets\.segment\(class, mask\)"
    ):
        vk.gradcam(model, x)
    with pytest.raises(ValueError, match="dense decoder makes its output instead of a head"):
        vk.legrad(model, x, target=vk.targets.segment(1))
    fix = (
        vk.targets.segment(1, square())
        if head == "segmentation"
        else vk.targets.depth_region(square())
    )
    for method in ("gradcam", "attnlrp", "integrated_gradients"):
        result = getattr(vk, method)(model, x, target=fix)
        assert torch.isfinite(result.maps).all() and result.maps.flatten(1).std(1).min() > 0


def test_curve_metrics_score_a_dense_target():
    """Deletion scores the target on the images as they are first (its curve's first point is
    the target's score on the model's output), then on ever more deleted ones."""
    model, x = dpt("segmentation"), images()
    target = vk.targets.segment(1, square())
    cam = vk.gradcam(model, x, target=target)
    result = vk.metrics.deletion(model, x, cam, target=target, steps=4, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(result.scores[:, 0], target(model(x)))
    assert result.scores.shape == (2, 5) and torch.isfinite(result.auc).all()
