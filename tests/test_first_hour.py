"""What a new user hits in the first hour: each error's suggested fix works, and valid input is
taken (a convolution's output, a bfloat16 model, a hook's wrong dtype named, an oversized
capture refused before the input is scanned)."""

import re

import pytest
import torch
from torch import nn

import vizkit as vk
from vizkit.analysis.attention_rollout import check_row_stochastic
from vizkit.hooks import inputs


def small_vit(**kwargs):
    return vk.create_model("vit_tiny_patch16_224", depth=2, **kwargs).eval()


def suggested(message: str, pattern: str) -> str:
    found = re.search(pattern, message)
    assert found, message
    return found.group(1)


@pytest.mark.parametrize("size", [(224, 320), (427, 640)])
def test_a_wrong_size_suggests_an_img_size_that_works(size):
    with pytest.raises(ValueError, match="Resize the images to 224x224") as error:
        vk.attention(small_vit(), torch.randn(1, 3, *size))
    fix = eval(suggested(str(error.value), r"img_size=(\(\d+, \d+\))"))
    resized = (
        suggested(str(error.value), r"resizing the images to (\d+x\d+)") if size[0] % 16 else ""
    )
    assert fix == size if not resized else fix == (432, 640) and resized == "432x640"
    result = vk.attention(small_vit(img_size=fix), torch.randn(1, 3, *fix), layers=-1)
    assert result.layout.grid == (fix[0] // 16, fix[1] // 16)


def test_channels_last_images_are_told_to_permute():
    x = torch.randn(1, 64, 80, 3)
    with pytest.raises(ValueError, match=r"channels-last.*permute\(0, 3, 1, 2\)") as error:
        vk.attention(small_vit(img_size=(64, 80)), x)
    fix = suggested(str(error.value), r"x(\.permute\(0, 3, 1, 2\))")
    assert fix and vk.attention(small_vit(img_size=(64, 80)), x.permute(0, 3, 1, 2), layers=-1)
    with pytest.raises(ValueError, match=r"one channels-last image.*permute\(2, 0, 1\)\[None\]"):
        vk.attention(small_vit(img_size=(64, 80)), x[0])


@pytest.mark.parametrize(
    "load, name, expected",
    [
        (vk.zoo.load, "vit_smal_patch16_224", "vit_small_patch16_224"),
        (vk.zoo.load, "vit_tiny_shape", "vit_tiny_shapes"),
        (vk.zoo.path, "vit_tiny_shape", "vit_tiny_shapes"),
    ],
)
def test_a_misspelt_model_gets_the_closest_names(load, name, expected):
    with pytest.raises(KeyError) as error:
        load(name)
    message = error.value.args[0]
    assert f"Did you mean: {expected}" in message and len(message) < 300, message


def test_pretrained_offline_says_what_is_missing_and_how_to_load_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # nothing cached
    with pytest.raises(OSError) as error:
        vk.zoo.load("vit_tiny_patch16_224", pretrained=True)
    message = str(error.value)
    assert "timm/vit_tiny_patch16_224" in message and "not in the local cache" in message
    assert "checkpoint='weights.safetensors'" in message
    with pytest.raises(TypeError):  # a wrong argument is timm's own error, not a hub message
        vk.create_model("vit_tiny_patch16_224", pretrained=True, no_such_argument=1)


def test_one_hot_targets_are_told_to_take_the_argmax():
    model, x = small_vit(num_classes=5), torch.randn(2, 3, 224, 224)
    one_hot = nn.functional.one_hot(torch.tensor([1, 3]), 5)
    for target in (one_hot.float(), one_hot):
        with pytest.raises(ValueError, match=r"target\.argmax\(dim=1\)"):
            vk.gradcam(model, x, target=target)
    result = vk.gradcam(model, x, target=one_hot.float().argmax(dim=1))
    assert result.targets.tolist() == [1, 3]


def test_a_two_dimensional_mask_is_not_called_a_missing_batch_axis():
    maps = torch.rand(2, 4, 4)
    with pytest.raises(ValueError, match=r"2-D tensor is one map.*one full map each") as error:
        vk.metrics.pointing_game(maps, torch.ones(2, 32, dtype=torch.bool))
    assert "add the batch axis" in str(error.value)  # only for one image's map


def test_uint8_images_point_to_load_images():
    with pytest.raises(TypeError, match=r"vk\.datasets\.load_images"):
        vk.attention(small_vit(), torch.zeros(1, 3, 224, 224, dtype=torch.uint8))


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)  # (B, 8, 16, 16): 8 ~ 16
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.conv2(self.conv1(x).relu()).relu().mean((2, 3)))


def test_a_convolution_output_is_channels_first():
    torch.manual_seed(0)
    model, x = TinyCNN().eval(), torch.randn(2, 3, 32, 32)
    cam = vk.gradcam(model, x, layer="conv2.hook_out", target=1)
    _, cache = vk.HookedModel(model).run_with_cache(x, names="conv2.hook_out", grads=True, target=1)
    act, grad = cache["conv2.hook_out"], cache["conv2.hook_out_grad"]
    expected = (grad.mean((2, 3), keepdim=True) * act).sum(1).relu()  # Grad-CAM, Eq. 1-2
    expected = expected / expected.flatten(1).amax(1)[:, None, None].clamp_min(1e-12)
    got = cam.maps / cam.maps.flatten(1).amax(1)[:, None, None].clamp_min(1e-12)
    assert cam.maps.shape == (2, 16, 16)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_bfloat16_rollout_runs_and_non_stochastic_maps_still_fail():
    torch.manual_seed(0)
    model = small_vit()
    x = torch.randn(2, 3, 224, 224)
    full = vk.rollout(model, x)
    half = vk.rollout(model.bfloat16(), x.bfloat16())
    assert (
        torch.corrcoef(torch.stack([full.maps.flatten(), half.maps.float().flatten()]))[0, 1] > 0.99
    )
    rows = torch.softmax(torch.randn(2, 3, 50, 50), -1).bfloat16()
    check_row_stochastic(rows, "bf16 softmax")  # rounded rows pass
    with pytest.raises(ValueError, match="not row-stochastic"):
        check_row_stochastic(rows * 1.02, "scaled")  # 2 % off is not rounding
    with pytest.raises(ValueError, match="not row-stochastic"):
        check_row_stochastic(torch.softmax(torch.randn(2, 50), -1) * 1.002, "float32 off")


def test_a_hook_returning_another_dtype_is_named():
    model, x = small_vit(), torch.randn(1, 3, 224, 224)
    hm = vk.HookedModel(model)
    with pytest.raises(TypeError, match=r"blocks\.0\.hook_attn_out returned a torch\.float64"):
        with hm.hooks(fwd={"blocks.0.hook_attn_out": lambda t, name: t.double()}):
            hm(x)
    with hm.hooks(fwd={"blocks.0.hook_attn_out": lambda t, name: t.double().float()}):
        hm(x)  # cast back: accepted


def test_an_oversized_capture_is_refused_before_the_input_is_scanned(monkeypatch):
    scanned = []
    real = inputs.check_values_finite
    monkeypatch.setattr(inputs, "check_values_finite", lambda *a: scanned.append(a) or real(*a))
    huge = torch.zeros(1, 3, 224, 224).expand(200_000, -1, -1, -1)
    for analysis in (vk.attention, vk.grad_rollout):
        with pytest.raises(ValueError, match="max_bytes"):
            analysis(small_vit(), huge)
    assert scanned == []
