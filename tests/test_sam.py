"""transformers' SAM (v1; Kirillov et al. 2023, "Segment Anything"; random-init small config,
nothing downloaded): its ViTDet-style image encoder as a family (windowed and global blocks,
maps equal to the model's own ``output_attentions``, the stream on the token grid), its prompt
held fixed (`vk.models.prompted_masks`) and a mask logit (`vk.targets.mask_logit`) equal to the
model's output reduced by hand, Grad-CAM of it equal to pytorch-grad-cam's, and rollout over
the windows computed where they tile the grid and refused where the model pads them."""

from __future__ import annotations

import pytest
import torch

import vizkit as vk

transformers = pytest.importorskip("transformers")

from test_promptable_masks import images, sam  # noqa: E402

GRID = 8  # 64 px in 8 px patches


def test_maps_equal_the_models_own_in_windows_and_over_the_grid():
    """The default (sdpa) model returns no weights: the maps vizkit reads from it equal those
    the eager model with the same weights returns, (B'·H, N, N) with B' = B·nW windows of 3 x 3
    tokens (the 8 x 8 grid padded to 9 x 9: 9 windows) or B over the 64 tokens."""
    model, x = sam(), images()
    eager = sam(attn="eager")
    eager.load_state_dict(model.state_dict())
    prompted = vk.models.prompted_masks(model, points=[[20, 30]])
    hm = vk.HookedModel(prompted)
    assert hm.family.family == "sam"
    names = [n for n in hm.hook_names() if n.endswith("hook_pattern")]
    assert names == [f"model.vision_encoder.layers.{i}.attn.hook_pattern" for i in range(3)]
    assert [hm.tap(n).kind for n in names] == ["window", "self", "window"]
    _, cache = hm.run_with_cache(x, names=names)
    with torch.no_grad():
        own = eager(pixel_values=x, input_points=torch.tensor([[[[20.0, 30]]]] * 2),
                    output_attentions=True).vision_attentions  # fmt: skip
    for name, theirs, (windows, tokens) in zip(names, own, [(18, 9), (2, 64), (18, 9)],
                                               strict=True):  # fmt: skip
        assert cache[name].shape == (windows, 2, tokens, tokens)
        torch.testing.assert_close(cache[name], theirs.view(windows, 2, tokens, tokens),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        assert float(cache[name].amax()) * tokens > 1.5  # not uniform: a key of 1.5 x its share


def test_the_stream_is_the_token_grid_as_the_encoder_computes_it():
    """hook_resid_pre / post of each block: its (B, 8, 8, 32) input / output as (B, 64, 32),
    equal to the encoder's blocks run by hand; hook_neck: the neck's (B, 32, 8, 8) as tokens."""
    model, x = sam(), images()
    encoder = model.vision_encoder
    hm = vk.HookedModel(encoder)
    names = [f"layers.{i}.hook_resid_{e}" for i in range(3) for e in ("pre", "post")]
    _, cache = hm.run_with_cache(x, names=[*names, "hook_neck"])
    with torch.no_grad():
        stream = encoder.patch_embed(x) + encoder.pos_embed
        for i, layer in enumerate(encoder.layers):
            torch.testing.assert_close(cache[f"layers.{i}.hook_resid_pre"], stream.flatten(1, 2))
            stream = layer(stream)
            torch.testing.assert_close(cache[f"layers.{i}.hook_resid_post"], stream.flatten(1, 2))
        neck = encoder.neck(stream)
    assert cache["layers.0.hook_resid_pre"].shape == (2, GRID * GRID, 32)
    torch.testing.assert_close(cache["hook_neck"], neck.flatten(2).transpose(1, 2))
    assert hm.token_layout((64, 64), "layers.2.hook_resid_post").grid == (GRID, GRID)


def test_rollout_over_tiling_windows_and_refused_over_padded_ones():
    """Windows of 4 tile the 8 x 8 grid: each window map goes onto the grid as a row-stochastic
    block-diagonal (B, H, 64, 64) map, and rollout runs through the windowed and global blocks.
    Windows of 3 pad the grid to 9 x 9: the padded keys have no place on the image, so rollout
    refuses, naming the cause and the maps as captured."""
    x = images()
    prompted = vk.models.prompted_masks(sam(window=4), points=[[20, 30]])
    hm = vk.HookedModel(prompted)
    name = "model.vision_encoder.layers.0.attn.hook_pattern"
    _, cache = hm.run_with_cache(x, names=[name])
    assert cache[name].shape == (2 * 4, 2, 16, 16)
    windows = hm.tap(name).geometry()
    on_grid = vk.hooks.windows.windows_to_grid(cache[name], (GRID, GRID), windows)
    assert on_grid.shape == (2, 2, 64, 64)
    torch.testing.assert_close(on_grid.sum(-1), torch.ones(2, 2, 64))
    cell = torch.arange(GRID * GRID)
    window = (cell // GRID // 4) * 2 + cell % GRID // 4  # each token's window, raster order
    outside = window[:, None] != window[None, :]
    assert float(on_grid[..., outside].abs().max()) == 0  # each token sees its window only
    assert float(on_grid[..., ~outside].min()) > 0
    result = vk.rollout(prompted, x)
    assert result.maps.shape == (2, GRID, GRID) and bool(torch.isfinite(result.maps).all())
    assert float(result.maps.std()) > 0
    padded = vk.models.prompted_masks(sam(window=3), points=[[20, 30]])
    with pytest.raises(ValueError, match=r"(?s)8x8 patch grid is not a multiple of its 3x3 "
                       r"windows.*64x64 inputs only.*run_with_cache"):  # fmt: skip
        vk.rollout(padded, x)
    _, cache = vk.HookedModel(padded).run_with_cache(x, names=[name])  # the fix given works
    assert cache[name].shape == (2 * 9, 2, 9, 9)
