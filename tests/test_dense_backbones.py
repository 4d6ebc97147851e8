"""Dense models over a covered backbone (transformers' UperNet and Mask2Former with a Swin
backbone, random-init small configs): the backbone's family found inside them, Mask2Former's
per-pixel class scores and query masks equal to its outputs reduced by hand (its semantic
inference), the analyses explaining a dense target over them, a class index refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vizkit as vk

transformers = pytest.importorskip("transformers")


def swin() -> object:
    return transformers.SwinConfig(
        image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
        window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"],
    )  # fmt: skip


def upernet() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.UperNetConfig(backbone_config=swin(), hidden_size=16, num_labels=3,
                                        use_auxiliary_head=False)  # fmt: skip
    return transformers.UperNetForSemanticSegmentation(config).eval()


def mask2former() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.Mask2FormerConfig(
        backbone_config=swin(), feature_size=32, mask_feature_size=32, hidden_dim=32,
        encoder_feedforward_dim=64, dim_feedforward=64, encoder_layers=1, decoder_layers=2,
        num_attention_heads=2, num_queries=8, num_labels=3, common_stride=4,
    )  # fmt: skip
    return transformers.Mask2FormerForUniversalSegmentation(config).eval()


def hooks(model: nn.Module) -> dict:
    return {name: (list(m._forward_hooks), list(m._backward_hooks), list(m._forward_pre_hooks))
            for name, m in model.named_modules()}  # fmt: skip


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def square() -> torch.Tensor:
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[8:40, 16:48] = True
    return mask


def test_mask2former_class_scores_and_query_masks_by_hand():
    model, x = mask2former(), images()
    with torch.no_grad():
        output = model(x)
    classes, masks = output.class_queries_logits, output.masks_queries_logits  # (B, Q, K + 1)
    by_hand = torch.zeros(2, 3, 16, 16)
    for q in range(8):  # each query's class probabilities (no "no object") times its mask
        by_hand += classes.softmax(-1)[:, q, :3, None, None] * masks[:, q, None].sigmoid()
    torch.testing.assert_close(vk.targets.dense_logits(output), by_hand)
    up = F.interpolate(by_hand[:, 2:3], size=(64, 64), mode="bilinear", align_corners=False)
    torch.testing.assert_close(vk.targets.segment(2, square())(output),
                               (up[:, 0] * square()).flatten(1).sum(1))  # fmt: skip
    query = masks[:, 5]
    covered = (query * (query > 0)).flatten(1).sum(1)
    torch.testing.assert_close(vk.targets.mask_logit(5)(output), covered)


@pytest.mark.parametrize("build", [upernet, mask2former], ids=["upernet", "mask2former"])
def test_dense_targets_over_a_swin_backbone(build):
    model, x = build(), images()
    before = hooks(model)  # transformers' backbones hook their stages themselves
    hm = vk.HookedModel(model)
    assert hm.family is not None and hm.family.family == "swin"
    with pytest.raises(ValueError, match=r"returns a map per image.*vk\.targets\.segment"):
        vk.gradcam(model, x, target=0)
    target = vk.targets.segment(1, square())
    for method in ("gradcam", "attnlrp", "integrated_gradients"):
        result = getattr(vk, method)(model, x, target=target)
        assert bool(torch.isfinite(result.maps).all()) and float(result.maps.abs().sum()) > 0
    assert hooks(model) == before
