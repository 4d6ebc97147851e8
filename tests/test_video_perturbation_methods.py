"""The perturbation methods on video models' clips (B, T, C, H, W) (transformers' ViViT, with
tubelets of 2 frames, and TimeSformer, one frame per token frame; random-init small configs,
nothing downloaded): Score-CAM, Ablation-CAM and occlusion equal a hand computation over
space-time (plain forward hooks, masked or occluded clips run by hand), the random baseline has
the clip's shape, passes of copies are sized by the byte budget per clip, a clip of one image
repeated gives the same map on every frame exactly when the model cannot tell its frames apart,
and what is not a clip is refused by the input contract."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vizkit as vk
from vizkit.hooks.passes import images_per_pass, one_image_bytes

pytest.importorskip("transformers")

import test_timesformer as timesformer  # noqa: E402
import test_video_families as families  # noqa: E402

KINDS = ["vivit", "timesformer"]
TARGET = 1
METHODS = ("scorecam", "ablationcam", "occlusion")


def clip_model(kind: str) -> tuple[nn.Module, torch.Tensor, int, nn.Module, str]:
    """A small random-init video classifier of ``kind``, two clips (2, 4, 3, 32, 32) for it,
    its tubelet (frames per token frame), its first block and the stream after that block's
    hook name (the CAMs' layer)."""
    if kind == "vivit":
        model = families.build("vivit")
        return model, families.clips(), 2, model.vivit.layers[0], "vivit.layers.1.hook_resid_pre"
    model = timesformer.build()
    block = model.timesformer.encoder.layer[0]
    return model, timesformer.clips(), 1, block, "timesformer.encoder.layer.1.hook_resid_pre"


def room(model: nn.Module, x: torch.Tensor) -> int:
    """A ``max_bytes`` of 32 clips' passes (fewer, larger forwards than the default's on the
    CPU; the maps do not depend on it)."""
    return 32 * one_image_bytes(model, x, False)


def frame_major(kind: str, tokens: torch.Tensor) -> torch.Tensor:
    """The block's output tokens (B, 1 + N', C) with the patches frame-major (TimeSformer holds
    them space-major)."""
    return timesformer.frame_major(tokens) if kind == "timesformer" else tokens


def block_output(
    model: nn.Module, block: nn.Module, x: torch.Tensor, edit=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, the block's output tokens) of a plain forward of x, the output replaced by
    ``edit(tokens)`` where given."""
    seen = {}

    def hook(module, args, out):
        tokens = out[0] if isinstance(out, tuple) else out
        seen["tokens"] = tokens
        if edit is None:
            return None
        edited = edit(tokens)
        return (edited, *out[1:]) if isinstance(out, tuple) else edited

    handle = block.register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = model(x).logits
    finally:
        handle.remove()
    return logits, seen["tokens"]


def channel_grid(kind: str, tokens: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, C, T', 4, 4): each channel over the clip's patch tokens, frame-major."""
    patches = frame_major(kind, tokens)[:, 1:]  # ViViT and TimeSformer: one class token
    return patches.transpose(1, 2).unflatten(2, (frames, 4, 4))


def cam(weights: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """relu(sum_c w_c A_c): (T', 4, 4) from weights (C,) and one clip's grid (C, T', 4, 4)."""
    return (weights[:, None, None, None] * grid).sum(0).clamp_min(0)


# ---- Score-CAM --------------------------------------------------------------------------------


def scorecam_by_hand(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(vizkit's maps, the hand's): each channel's (T', 4, 4) map upsampled bilinearly (aligned
    corners) on its token frame, each frame of the clip taking its token frame's, scaled to
    [0, 1] over the clip, times the clip; weights the softmax of the masked clips' scores."""
    model, x, tubelet, block, layer = clip_model(kind)
    frames = x.shape[1] // tubelet
    result = vk.scorecam(model, x, target=TARGET, layer=layer, max_bytes=room(model, x))
    _, tokens = block_output(model, block, x)
    grid = channel_grid(kind, tokens, frames)
    maps = []
    for b in range(len(x)):
        up = F.interpolate(grid[b], size=(32, 32), mode="bilinear", align_corners=True)
        up = up[:, torch.arange(x.shape[1]) // tubelet]  # (C, T, 32, 32): frame t, token t // k
        low, high = up.amin((1, 2, 3), keepdim=True), up.amax((1, 2, 3), keepdim=True)
        masks = (up - low) / (high - low)
        with torch.no_grad():
            scores = model(x[b] * masks[:, :, None]).logits[:, TARGET]
        maps.append(cam(scores.softmax(0), grid[b]))
    return result.maps, torch.stack(maps)


@pytest.mark.parametrize("kind", KINDS)
def test_scorecam_of_clips_by_hand(kind):
    ours, hand = scorecam_by_hand(kind)
    frames = 2 if kind == "vivit" else 4
    assert ours.shape == (2, frames, 4, 4)
    assert float(hand.amax()) > 0  # a map to compare, not zeros
    torch.testing.assert_close(ours, hand, rtol=1e-4, atol=1e-5 * float(hand.amax()))


# ---- Ablation-CAM -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_ablationcam_of_clips_by_hand(kind):
    """Each channel zeroed in every space-time patch token of the block's output (copy c
    zeroes channel c), weights the relative drop (y - y_c) / y of the target logit."""
    model, x, tubelet, block, layer = clip_model(kind)
    frames = x.shape[1] // tubelet
    result = vk.ablationcam(model, x, target=TARGET, layer=layer, max_bytes=room(model, x))
    logits, tokens = block_output(model, block, x)
    grid = channel_grid(kind, tokens, frames)
    channels = tokens.shape[-1]
    keep = 1 - torch.eye(channels)[:, None, :]  # (C copies, 1, C): copy c without channel c

    def zeroed(out: torch.Tensor) -> torch.Tensor:
        return torch.cat([out[:, :1], out[:, 1:] * keep], 1)  # the class token kept

    maps = []
    for b in range(len(x)):
        copies = x[b : b + 1].expand(channels, *x.shape[1:])
        ablated = block_output(model, block, copies, zeroed)[0][:, TARGET]
        clean = logits[b, TARGET]
        maps.append(cam((clean - ablated) / clean, grid[b]))
    hand = torch.stack(maps)
    assert result.maps.shape == (2, frames, 4, 4) and float(hand.amax()) > 0
    torch.testing.assert_close(result.maps, hand, rtol=1e-4, atol=1e-5 * float(hand.amax()))


# ---- occlusion --------------------------------------------------------------------------------


def target_scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits[:, TARGET]


@pytest.mark.parametrize("kind", KINDS)
def test_occlusion_of_clips_is_the_drop_of_each_space_time_window(kind):
    """Default windows: one token, a tubelet's frames x the 8 x 8 patch, not overlapping; the
    cells of one window are the drop of the target logit with that window set to 0 by hand."""
    model, x, tubelet, _, _ = clip_model(kind)
    result = vk.occlusion(model, x, target=TARGET, max_bytes=room(model, x))
    assert result.maps.shape == (2, 4, 32, 32) and result.frames == 4
    assert result.options["window"] == (tubelet, 8, 8) == result.options["stride"]
    frames = slice(tubelet, 2 * tubelet)  # the second token frame's
    occluded = x.clone()
    occluded[:, frames, :, 8:16, 16:24] = 0
    drop = target_scores(model, x) - target_scores(model, occluded)
    cells = result.maps[:, frames, 8:16, 16:24]
    scale = float(result.maps.abs().amax())
    assert scale > 0 and float(drop.abs().amin()) > 1e-3 * scale  # a drop to compare
    torch.testing.assert_close(cells, drop[:, None, None, None].expand_as(cells),
                               rtol=1e-4, atol=1e-5 * scale)  # fmt: skip


def test_overlapping_occlusion_of_clips_averages_the_windows_over_space_and_time():
    """Windows (2, 16, 16) at stride (1, 8, 8) on TimeSformer's 4 frames: frame 1, pixel
    (8, 8) lies in the windows starting at frames {0, 1}, rows {0, 8} and columns {0, 8}; its
    value is the mean of those 8 windows' drops, each computed by hand."""
    model, x, _, _, _ = clip_model("timesformer")
    result = vk.occlusion(model, x, target=TARGET, window=(2, 16, 16), stride=(1, 8, 8),
                          max_bytes=room(model, x))  # fmt: skip
    clean, drops = target_scores(model, x), []
    for t in (0, 1):
        for row in (0, 8):
            for col in (0, 8):
                occluded = x.clone()
                occluded[:, t : t + 2, :, row : row + 16, col : col + 16] = 0
                drops.append(clean - target_scores(model, occluded))
    expected = torch.stack(drops).mean(0)
    scale = float(result.maps.abs().amax())
    torch.testing.assert_close(result.maps[:, 1, 8, 8], expected, rtol=1e-4, atol=1e-5 * scale)
    # frame 0 lies in the windows starting at frame 0 only: another mean
    assert float((result.maps[:, 0, 8, 8] - expected).abs().amax()) > 1e-3 * scale


# ---- random -----------------------------------------------------------------------------------


def test_random_maps_of_clips_have_each_frame():
    model, x, _, _, _ = clip_model("vivit")
    result = vk.random_saliency(model, x, target=TARGET, seed=7)
    expected = torch.rand(2, 4, 32, 32, generator=torch.Generator().manual_seed(7))
    assert result.frames == 4 and torch.equal(result.maps, expected)
    assert result.targets.tolist() == [TARGET, TARGET]
    assert result.upsample().shape == (2, 4, 32, 32)


# ---- the byte budget --------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_passes_of_copies_hold_as_many_clips_as_the_budget_allows(method):
    """One clip's pass counts its 4 frames (at least the clip's own bytes); with room for 5
    clips, every forward the method runs holds at most 5 clips of 4 frames, and some hold 5;
    room for less than one clip is refused with the size that fits."""
    model, x, _, _, _ = clip_model("timesformer")
    per_clip = one_image_bytes(model, x, False)
    assert per_clip > x[0].nbytes == 4 * x[0, 0].nbytes, per_clip
    assert images_per_pass(model, x, 5 * per_clip, False, method) == 5
    batches = []
    handle = model.register_forward_pre_hook(lambda module, args: batches.append(args[0].shape))
    try:
        getattr(vk, method)(model, x, target=TARGET, max_bytes=5 * per_clip)
    finally:
        handle.remove()
    assert all(shape[1:] == x.shape[1:] for shape in batches)
    assert max(shape[0] for shape in batches) == 5
    copies = 64 if method == "occlusion" else 32  # 4 x 4 x 4 windows, or 32 channels
    assert len(batches) >= 2 * math.ceil(copies / 5)
    with pytest.raises(ValueError, match=rf"One image's pass of {method} holds.*max_bytes="):
        getattr(vk, method)(model, x, target=TARGET, max_bytes=per_clip - 1)


# ---- a clip of one image ----------------------------------------------------------------------


def one_image_clips() -> torch.Tensor:
    """Two clips (2, 4, 3, 32, 32), each one image repeated over its 4 frames."""
    image = torch.randn(2, 1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    return image.expand(2, 4, 3, 32, 32).contiguous()


def frame_spread(maps: torch.Tensor) -> float:
    """The largest difference of any frame's map from the first frame's, over max |map|."""
    return float((maps - maps[:, :1]).abs().amax() / maps.abs().amax())


def time_signal(kind: str, model: nn.Module) -> nn.Parameter:
    """What tells the model's frames apart: ViViT's position embedding (per space-time token),
    TimeSformer's time embedding (per frame)."""
    if kind == "vivit":
        return model.vivit.embeddings.position_embeddings
    return model.timesformer.embeddings.time_embeddings


@pytest.mark.parametrize("kind", KINDS)
def test_a_clip_of_one_image_has_the_same_map_on_every_frame_iff_frames_look_alike(kind):
    """Random-init ViViT and TimeSformer start with a zero position / time embedding: nothing
    else tells their frames apart (attention is blind to order), so on a clip of one image
    every token frame's stream is the same, and each method's map is the same on every frame
    (occlusion to rounding: the occluded clips are each other's frames reordered). Once the
    embedding is drawn, the frames differ and so do their maps (measured spread 0.26-0.84 of
    max |map| at std 0.5)."""
    model, _, _, _, _ = clip_model(kind)
    x = one_image_clips()
    assert not time_signal(kind, model).any()  # the premise: nothing tells the frames apart
    for method in METHODS:
        maps = getattr(vk, method)(model, x, target=TARGET, max_bytes=room(model, x)).maps
        assert frame_spread(maps) < 1e-4, (method, frame_spread(maps))
    with torch.no_grad():
        time_signal(kind, model).normal_(std=0.5, generator=torch.Generator().manual_seed(0))
    for method in METHODS:
        maps = getattr(vk, method)(model, x, target=TARGET, max_bytes=room(model, x)).maps
        assert frame_spread(maps) > 0.1, (method, frame_spread(maps))


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [*METHODS, "random_saliency"])
def test_a_batch_of_images_is_refused_as_not_a_clip(method):
    model, x, _, _, _ = clip_model("vivit")
    with pytest.raises(ValueError, match=r"takes videos \(B, 4, 3, 32, 32\).*not a video"):
        getattr(vk, method)(model, x[:, 0], target=TARGET)


def test_occlusion_refuses_a_window_longer_than_the_clip():
    model, x, _, _, _ = clip_model("timesformer")
    with pytest.raises(ValueError, match=r"up to the clip's 4 frames.*got \(5, 8, 8\)"):
        vk.occlusion(model, x, window=(5, 8, 8))
    with pytest.raises(TypeError, match=r"\(t, h, w\) with t an int"):
        vk.occlusion(model, x, window=(1.5, 8, 8))
    with pytest.raises(ValueError, match=r"stride \(2, 8, 8\) is larger than the window"):
        vk.occlusion(model, x, window=(1, 8, 8), stride=(2, 8, 8))
    spatial = vk.occlusion(model, x, window=16)  # the space part; one frame (the tubelet)
    assert spatial.options["window"] == (1, 16, 16) == spatial.options["stride"]
