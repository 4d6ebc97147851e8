"""A promptable mask model (transformers' SAM 2, random-init small config, nothing downloaded)
with its prompt held fixed (`vk.models.prompted_masks`): its output equal to the model called
with the prompt by hand, `vk.targets.mask_logit` equal to the mask logits reduced by hand, Grad-CAM
of a mask logit equal to pytorch-grad-cam's ``SemanticSegmentationTarget`` on the same Hiera
block, and a class index refused with a fix that works."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vizkit as vk
from vizkit.models.representatives import small_sam_config

transformers = pytest.importorskip("transformers")


def sam2() -> nn.Module:
    """SAM 2 at 64 px: a Hiera image encoder of four stages (8 to 64 channels; windowed and one
    global block), its feature pyramid, a prompt encoder and a two-way mask decoder of width 32;
    mask logits at 16 x 16."""
    torch.manual_seed(0)
    backbone = transformers.Sam2HieraDetConfig(
        hidden_size=8, embed_dim_per_stage=[8, 16, 32, 64], blocks_per_stage=[1, 1, 2, 1],
        num_attention_heads_per_stage=[1, 1, 1, 1], global_attention_blocks=[3],
        window_size_per_stage=[8, 4, 4, 2], image_size=[64, 64],
        window_positional_embedding_background_size=[2, 2],
    )  # fmt: skip
    vision = transformers.Sam2VisionConfig(
        backbone_config=backbone, backbone_channel_list=[64, 32, 16, 8],
        backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]], fpn_hidden_size=32,
    )  # fmt: skip
    config = transformers.Sam2Config(
        vision_config=vision,
        prompt_encoder_config=transformers.Sam2PromptEncoderConfig(
            hidden_size=32, image_size=64, patch_size=16),
        mask_decoder_config=transformers.Sam2MaskDecoderConfig(
            hidden_size=32, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32),
    )  # fmt: skip
    return transformers.Sam2Model(config).eval()


def sam(window: int = 3, attn: str = "sdpa") -> nn.Module:
    """SAM at 64 px: an 8 x 8 patch grid of width 32, three blocks (the middle one global, the
    others in ``window`` x ``window`` windows: 3 pads the grid to 9 x 9), its neck, prompt
    encoder and two-way mask decoder of width 32; mask logits at 32 x 32. The relative and
    absolute position embeddings (zero at init) are drawn at random, so they shape the maps."""
    torch.manual_seed(0)
    model = transformers.SamModel(small_sam_config(window, attn)).eval()
    with torch.no_grad():
        for name, p in model.vision_encoder.named_parameters():
            if "rel_pos" in name or name == "pos_embed":
                p.normal_(0, 0.5)
    return model


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def region() -> torch.Tensor:
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[8:40, 16:48] = True
    return mask


# each model: its builder, its masks' side, the block Grad-CAM reads and that block's grid
MODELS = {
    "sam2": (sam2, 16, "model.vision_encoder.backbone.blocks.2", 4),
    "sam": (sam, 32, "model.vision_encoder.layers.1", 8),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_prompt_is_given_to_every_image_and_the_target_reduces_by_hand(kind):
    build, side, _, _ = MODELS[kind]
    model, x = build(), images(3)
    prompted = vk.models.prompted_masks(model, points=[[20, 30], [40, 12]], labels=[1, 0])
    with torch.no_grad():
        ours = prompted(x).pred_masks
        points = torch.tensor([[[[20.0, 30], [40, 12]]]] * 3)  # (B, P, n, 2)
        labels = torch.tensor([[[1, 0]]] * 3)
        theirs = model(pixel_values=x, input_points=points, input_labels=labels,
                       multimask_output=False)  # fmt: skip
    assert ours.shape == (3, 1, 1, side, side) and float(ours.std()) > 0
    torch.testing.assert_close(ours, theirs.pred_masks)
    logits = ours[:, 0, 0]
    up = F.interpolate(logits[:, None], size=(64, 64), mode="bilinear", align_corners=False)
    torch.testing.assert_close(vk.targets.mask_logit(0, region())(prompted(x)),
                               (up[:, 0] * region()).flatten(1).sum(1))  # fmt: skip
    covered = (logits * (logits > 0)).flatten(1).sum(1)
    torch.testing.assert_close(vk.targets.mask_logit()(prompted(x)), covered)
    three = vk.models.prompted_masks(model, boxes=[8, 8, 40, 40], multimask_output=True)
    with torch.no_grad():
        masks = three(x).pred_masks
        by_hand = model(pixel_values=x, input_boxes=torch.tensor([[[8.0, 8, 40, 40]]] * 3),
                        multimask_output=True).pred_masks  # fmt: skip
    assert masks.shape == (3, 1, 3, side, side)
    torch.testing.assert_close(masks, by_hand)
    torch.testing.assert_close(vk.targets.mask_logit(2, region())(three(x)),
                               (F.interpolate(masks[:, 0, 2:3], size=(64, 64), mode="bilinear")
                                [:, 0] * region()).flatten(1).sum(1))  # fmt: skip
    with pytest.raises(ValueError, match="mask 3 of prompt 0 is out of range.*1 prompt"):
        vk.targets.mask_logit(3)(three(x))


@pytest.mark.parametrize("kind", list(MODELS))
def test_gradcam_of_a_mask_logit_equals_pytorch_grad_cam(kind):
    """pytorch-grad-cam's SemanticSegmentationTarget on the masks as "classes" (mask 0's logits
    summed over a region of the low-resolution output), at an encoder block (SAM 2: the third
    stage's first Hiera block; SAM: the global block), its channels-last (B, h, w, C) output
    permuted by hand."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    build, side, block, grid = MODELS[kind]
    model, x = build(), images(3)
    prompted = vk.models.prompted_masks(model, points=[[20, 30]])
    low = torch.zeros(side, side, dtype=torch.bool)
    low[side // 8 : side * 5 // 8, side // 4 : side * 3 // 4] = True
    ours = vk.gradcam(prompted, x, target=vk.targets.mask_logit(0, low),
                      layer=f"{block}.hook_resid_post")  # fmt: skip
    assert ours.maps.shape == (3, grid, grid)

    class Masks(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, images):
            return self.inner(images).pred_masks[:, 0]  # (B, M, h, w): the masks as classes

    targets = [SemanticSegmentationTarget(0, low.float().numpy())] * len(x)
    with GradCAM(Masks(prompted), target_layers=[prompted.get_submodule(block)],
                 reshape_transform=lambda t: t.permute(0, 3, 1, 2)) as cam:  # fmt: skip
        theirs = cam(x, targets=targets)
    for a, b in zip(ours.upsample().flatten(1).numpy(), theirs.reshape(len(x), -1), strict=True):
        assert a.std() > 0 and np.corrcoef(a, b)[0, 1] > 0.999


def test_a_class_index_is_refused_with_a_fix_that_works():
    model, x = sam2(), images()
    prompted = vk.models.prompted_masks(model, points=[[20, 30]])
    with pytest.raises(ValueError, match=r"returns a map per image.*vk\.targets\.mask_logit"):
        vk.gradcam(prompted, x)
    for method in ("attnlrp", "integrated_gradients"):
        result = getattr(vk, method)(prompted, x, target=vk.targets.mask_logit(0, region()))
        assert result.maps.shape == (2, 64, 64) and float(result.maps.abs().sum()) > 0
    with pytest.raises(ValueError, match=r"pred_masks \(B, P, M, h, w\).*prompted_masks"):
        vk.targets.mask_logit()(torch.zeros(2, 3, 8, 8))
    embedding = transformers.modeling_outputs.BaseModelOutput(last_hidden_state=x)
    with pytest.raises(ValueError, match="class logits .* the model gave BaseModelOutput"):
        vk.targets.segment(1)(embedding)  # a backbone's output: its type named, not None's
    with pytest.raises(ValueError, match="Give the prompt"):
        vk.models.prompted_masks(model)
    with pytest.raises(ValueError, match=r"points must be \(n, 2\)"):
        vk.models.prompted_masks(model, points=[1, 2, 3])
    assert not any(m._forward_hooks or m._backward_hooks for m in model.modules())
