"""Token layout comes from the model: prefix tokens and grid, for any input size."""

import pytest
import torch

import vizkit as vk
from vizkit.hooks import TokenLayout


@pytest.mark.parametrize(
    "name, kwargs, size, prefix, grid",
    [
        ("test_vit", {}, (64, 64), 1, (4, 4)),  # class token
        ("test_vit", {}, (96, 160), 1, (6, 10)),  # dynamic size, not square
        ("test_vit2", {}, (64, 48), 1, (4, 3)),  # no class token, 1 register
        ("deit_tiny_distilled_patch16_224", {"img_size": 32, "depth": 1}, (32, 32), 2, (2, 2)),
        (
            "vit_tiny_patch16_224",
            {"img_size": 48, "depth": 1, "reg_tokens": 4},
            (48, 48),
            5,
            (3, 3),
        ),
        (
            "vit_tiny_patch16_224",
            {"img_size": 40, "depth": 1, "dynamic_img_size": True, "dynamic_img_pad": True},
            (40, 56),
            1,
            (3, 4),
        ),
    ],
)
def test_layout_matches_the_tokens_the_model_makes(name, kwargs, size, prefix, grid):
    model = vk.create_model(name, **kwargs).eval()
    hm = vk.HookedModel(model)
    x = torch.randn(1, 3, *size)
    layout = hm.token_layout(size)
    assert (layout.num_prefix_tokens, layout.grid) == (prefix, grid)
    _, cache = hm.run_with_cache(x, names=["hook_embed", "blocks.0.hook_resid_post"])
    assert cache.layout == layout
    assert cache["hook_embed"].shape[1] == layout.num_patches
    assert cache["blocks.0.hook_resid_post"].shape[1] == layout.num_tokens


def test_cait_stages_have_their_own_prefix(cait):
    model, x = cait
    hm = vk.HookedModel(model)
    assert hm.token_layout((64, 64)).num_prefix_tokens == 1
    assert hm.token_layout((64, 64), "blocks.0.hook_resid_post").num_prefix_tokens == 0
    assert hm.token_layout((64, 64), "blocks.-1.attn.hook_pattern").num_tokens == 16
    assert hm.token_layout((64, 64), "hook_final_norm").num_tokens == 17


def test_cnn_has_no_token_layout():
    hm = vk.HookedModel(vk.create_model("resnet18", num_classes=2))
    assert hm.token_layout((64, 64)) is None


def test_split_and_grid():
    layout = TokenLayout(num_prefix_tokens=2, grid=(2, 3))
    tokens = torch.arange(2 * 8 * 4.0).reshape(2, 8, 4)  # (B, N, C)
    prefix, patches = layout.split(tokens)
    assert prefix.shape == (2, 2, 4) and patches.shape == (2, 6, 4)
    assert torch.equal(patches, tokens[:, 2:])
    row = torch.arange(6.0)
    assert torch.equal(layout.to_grid(row), torch.tensor([[0.0, 1, 2], [3, 4, 5]]))  # row-major
    with pytest.raises(ValueError, match="Expected 8 tokens"):
        layout.split(tokens[:, 1:])
    with pytest.raises(ValueError, match="Expected 6 patch values"):
        layout.to_grid(torch.zeros(5))
