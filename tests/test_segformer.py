"""SegFormer (transformers, random-init small config, nothing downloaded): four stages on their
own grids, efficient self-attention over reduced keys equal to the model's own weights, each
block's branches adding up to its stream, Grad-CAM of a segmentation class equal to
pytorch-grad-cam's ``SemanticSegmentationTarget`` on the same layer, and what does not apply
(rollout over reduced keys, a class index on per-pixel logits) refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")


def segformer() -> nn.Module:
    """Four stages of one block (widths 8, 16, 16, 32; key reduction 4, 2, 2, 1), 3 classes;
    at 64 px the stage grids are 16, 8, 4 and 2 patches a side, the logits 16 x 16."""
    torch.manual_seed(0)
    config = transformers.SegformerConfig(
        depths=[1, 1, 1, 1], sr_ratios=[4, 2, 2, 1], hidden_sizes=[8, 16, 16, 32],
        num_attention_heads=[1, 2, 2, 2], mlp_ratios=[2, 2, 2, 2], decoder_hidden_size=16,
        num_labels=3,
    )  # fmt: skip
    return transformers.SegformerForSemanticSegmentation(config).eval()


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def test_maps_equal_the_models_own_over_reduced_keys():
    model, x = segformer(), images()
    hm = vk.HookedModel(model)
    names = [n for n in hm.hook_names() if n.endswith("hook_pattern")]
    assert [hm.tap(n).kind for n in names] == ["pooled", "pooled", "pooled", "self"]
    _, cache = hm.run_with_cache(x, names=names)
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            own = model(x, output_attentions=True).attentions
    finally:
        model.config._attn_implementation = "sdpa"
    for name, theirs, (queries, keys) in zip(
        names, own, [(256, 16), (64, 16), (16, 4), (4, 4)], strict=True
    ):
        assert cache[name].shape[-2:] == (queries, keys)
        torch.testing.assert_close(cache[name], theirs, rtol=1e-5, atol=1e-6)
    result = vk.attention(model, x)  # the self-attention of the last stage
    assert result.layout.grid == (2, 2) and result.patterns.shape == (1, 2, 2, 4, 4)
    for s, side in enumerate((16, 8, 4, 2)):
        assert hm.token_layout((64, 64), f"segformer.stages.{s}.blocks.0.hook_resid_post").grid == (
            side, side)  # fmt: skip


def test_each_blocks_branches_add_up_to_its_stream():
    model, x = segformer(), images()
    block = "segformer.stages.1.blocks.0"
    leaves = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out",
              "hook_resid_post")  # fmt: skip
    _, cache = vk.HookedModel(model).run_with_cache(x, names=[f"{block}.{n}" for n in leaves])
    pre, attn, mid, mlp, post = (cache[f"{block}.{n}"] for n in leaves)
    assert pre.shape == (2, 64, 16)
    torch.testing.assert_close(pre + attn, mid)
    torch.testing.assert_close(mid + mlp, post)
    assert float(attn.abs().max()) > 0 and float(mlp.abs().max()) > 0


def test_gradcam_of_a_segmentation_class_equals_pytorch_grad_cam():
    """pytorch-grad-cam's SemanticSegmentationTarget (class 2's logits summed over a mask of
    the 16 x 16 output) at the third stage's block, its tokens reshaped onto the 4 x 4 grid by
    hand."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    model, x = segformer(), images(3)
    mask = torch.zeros(16, 16, dtype=torch.bool)
    mask[4:12, 2:10] = True
    ours = vk.gradcam(model, x, target=vk.targets.segment(2, mask),
                      layer="segformer.stages.2.blocks.0.hook_resid_post")  # fmt: skip
    assert ours.maps.shape == (3, 4, 4)

    class Logits(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, images):
            return self.inner(images).logits

    def reshape(tokens):  # (B, 16, C) -> (B, C, 4, 4)
        return tokens.reshape(len(tokens), 4, 4, -1).permute(0, 3, 1, 2)

    targets = [SemanticSegmentationTarget(2, mask.float().numpy())] * len(x)
    layer = model.segformer.stages[2].blocks[0]
    with GradCAM(Logits(model), target_layers=[layer], reshape_transform=reshape) as cam:
        theirs = cam(x, targets=targets)  # min-max scaled, resized to 64 x 64
    for a, b in zip(ours.upsample().flatten(1).numpy(), theirs.reshape(len(x), -1), strict=True):
        assert a.std() > 0 and np.corrcoef(a, b)[0, 1] > 0.999


def test_what_does_not_apply_is_refused_with_the_reason():
    model, x = segformer(), images()
    with pytest.raises(ValueError, match="pooled attention"):
        vk.rollout(model, x)
    with pytest.raises(ValueError, match=r"returns a map per image.*vk\.targets\.segment"):
        vk.gradcam(model, x, target=1)
    target = vk.targets.segment(1)  # the pixels class 1 wins
    for method in ("attnlrp", "integrated_gradients", "saliency"):
        result = getattr(vk, method)(model, x, target=target)
        assert result.maps.shape == (2, 64, 64) and bool(torch.isfinite(result.maps).all())
