"""The hook core's warnings name the line that called it (run_with_cache, or the with
statement of hooks()), not a line inside vizkit or contextlib."""

import pytest
import timm
import torch
from torch import nn

import vizkit as vk


class OneBranchUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.used(x).mean((2, 3))


def test_a_pattern_match_that_did_not_fire_is_reported_at_the_call():
    hm = vk.HookedModel(OneBranchUsed().eval())
    with pytest.warns(UserWarning, match="did not fire") as caught:
        hm.run_with_cache(torch.randn(2, 3, 16, 16), names="*used.hook_out")
    assert [w.filename for w in caught] == [__file__]


@pytest.mark.parametrize("call", ["run_with_cache", "hooks"])
def test_the_training_mode_warning_is_reported_at_the_call(call):
    model = timm.create_model(  # left in training mode, with dropout
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, drop_rate=0.1
    )
    hm, x = vk.HookedModel(model), torch.randn(2, 3, 32, 32)
    with pytest.warns(UserWarning, match="training mode") as caught:
        if call == "run_with_cache":
            hm.run_with_cache(x, names="blocks.0.hook_resid_post")
        else:
            with hm.hooks(fwd={"blocks.0.hook_resid_post": lambda t, name: None}):
                model(x)
    assert [w.filename for w in caught] == [__file__]
