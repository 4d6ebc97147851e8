"""LeGrad against torch-cam's implementation on torchvision's ViT (its score projection set to
the readout the model uses: the encoder's norm, the class token, the heads), on every layer; and
on timm's ViT family through the family's head readout."""

from __future__ import annotations

import pytest
import torch
from conftest import build

import vizkit as vk

torchvision = pytest.importorskip("torchvision")
torchcam = pytest.importorskip("torchcam.methods")


def test_legrad_equals_torch_cam_on_torchvision_vit():
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=5,
    ).eval()  # fmt: skip
    torch.nn.init.normal_(model.heads.head.weight)  # torchvision starts it at zero
    x, targets = torch.randn(3, 3, 32, 32), [2, 0, 4]
    ours = vk.legrad(model, x, target=targets)

    def readout(tokens):
        return model.heads(model.encoder.ln(tokens)[:, 0])

    with torchcam.LeGrad(model, list(model.encoder.layers), score_projection=readout) as cam:
        theirs = cam(targets, model(x), normalized=False)[0]
    torch.testing.assert_close(ours.maps, theirs, rtol=1e-5, atol=1e-6 * theirs.abs().max())
    assert ours.options["layers"][0] == "encoder.layers.encoder_layer_0.self_attention.hook_pattern"
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("key", ["vit", "deit_distilled", "vit_reg_avg"])
def test_legrad_on_timm_vits_reads_their_head_per_layer(key):
    model, x = build(key)
    result = vk.legrad(model, x[:2], target=1)
    assert result.maps.shape == (2, *result.layout.grid) and (result.maps >= 0).all()
    last = vk.legrad(model, x[:2], target=1, layers=-1)  # one layer: its own map alone
    assert last.options["layers"] == result.options["layers"][-1:]
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_legrad_refuses_without_a_readout_or_on_mixed_layouts():
    model, x = build("cait")  # CaiT's head reads the class-attention stage, not a block
    with pytest.raises(ValueError, match="knows no such readout"):
        vk.legrad(model, x)


def test_legrad_refuses_a_wrapper_with_a_head_of_its_own():
    """The family's head is the inner ViT's: a wrapper's own head would make each layer's
    score explain another output."""
    import timm

    vit = timm.create_model("test_vit", num_classes=10).eval()
    wrapped = torch.nn.Sequential(vit, torch.nn.Linear(10, 3)).eval()
    x = torch.randn(1, 3, 64, 64)
    with pytest.raises(ValueError, match="adds a head of its own"):
        vk.legrad(wrapped, x, target=2)
    same_head = torch.nn.Sequential(torch.nn.Identity(), vit).eval()  # e.g. a normalization
    torch.testing.assert_close(vk.legrad(same_head, x, target=2).maps,
                               vk.legrad(vit, x, target=2).maps)  # fmt: skip
