"""Bad input gets a clear error that says what was wrong and what is valid."""

import pytest
import torch
from torch import nn

import vizkit as vk
from vizkit.hooks import HookPoint


def test_input_rank_channels_and_size():
    vit = vk.HookedModel(vk.create_model("deit_tiny_patch16_224", img_size=64, depth=1).eval())
    with pytest.raises(ValueError, match=r"unsqueeze"):
        vit(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match=r"3-channel"):
        vit.run_with_cache(torch.randn(1, 1, 64, 64), names="hook_embed")
    with pytest.raises(ValueError, match=r"built for 64x64.*img_size=\(48, 48\)"):
        vit(torch.randn(1, 3, 48, 48))
    with pytest.raises(TypeError, match="tensor"):
        vit([1, 2, 3])
    dynamic = vk.HookedModel(vk.create_model("test_vit").eval())
    with pytest.raises(ValueError, match="multiple of the patch size 16x16"):
        dynamic(torch.randn(1, 3, 70, 64))
    cnn = vk.HookedModel(vk.create_model("resnet18", num_classes=3).eval())
    with pytest.raises(ValueError, match="3-channel"):
        cnn(torch.randn(1, 4, 32, 32))


@pytest.mark.parametrize(
    "target, match",
    [
        (10, r"class 10 is out of range.*10 classes \(valid: 0..9\)"),
        (-1, "out of range"),
        ([1, 2, 3], "3 targets for a batch of 2"),
        ("cat", "target must be"),
        (lambda out: "not a tensor", "must return a tensor"),
    ],
)
def test_bad_targets(target, match):
    hm = vk.HookedModel(vk.create_model("test_vit", num_classes=10).eval())
    with pytest.raises((ValueError, TypeError), match=match):
        hm.run_with_cache(torch.randn(2, 3, 32, 32), names="hook_embed", grads=True, target=target)


def test_requested_hook_that_does_not_fire():
    distilled = vk.create_model("deit_tiny_distilled_patch16_224", img_size=32, depth=1).eval()
    hm = vk.HookedModel(distilled)  # its head skips fc_norm
    with pytest.raises(RuntimeError, match="did not fire.*fc_norm.hook_out"):
        hm.run_with_cache(torch.randn(1, 3, 32, 32), names="fc_norm.hook_out")
    with (
        pytest.raises(RuntimeError, match="did not fire"),
        hm.hooks(fwd={"hook_embed": lambda t, name: None}),
    ):
        pass  # the model never ran inside the context


def test_bad_replacements_and_outputs():
    hm = vk.HookedModel(vk.create_model("test_vit").eval())
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(ValueError, match=r"replacement must be a tensor of the activation's shape"):
        with hm.hooks(fwd={"blocks.0.attn.hook_pattern": lambda t, name: t[:, :1]}):
            hm(x)

    class Pair(nn.Module):
        def forward(self, x):
            return x, -x

    class TupleOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = Pair()

        def forward(self, x):
            return self.pair(x)[0].mean()

    hm = vk.HookedModel(TupleOut())
    with pytest.raises(TypeError, match="'pair' gave a tuple, not a tensor"):
        hm.run_with_cache(torch.randn(1, 3, 4, 4), names="pair.hook_out")
    with pytest.raises(TypeError, match=r"\['pair.hook_out'\] gave tuples or lists"):
        hm.run_with_cache(torch.randn(1, 3, 4, 4), names="*")


def test_in_place_change_after_capture_is_caught():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.hook_x = HookPoint()

        def forward(self, x):
            y = self.hook_x(x * 2)
            return y.relu_()  # changes the captured tensor afterwards

    with pytest.raises(RuntimeError, match="modified in place"):
        vk.HookedModel(InPlace()).run_with_cache(torch.randn(1, 3, 4, 4), names="hook_x")


def test_hooked_model_needs_a_module():
    with pytest.raises(TypeError, match="nn.Module"):
        vk.HookedModel(lambda x: x)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="Unknown model .* Did you mean: vit_tiny_patch16_224"):
        vk.create_model("vit_tiny_patch16_2244")
