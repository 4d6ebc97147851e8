"""Video inputs: `vk.datasets.load_video` (frames from a folder or an array, sampled as the
model's config expects, normalized with its own processor's statistics, checked against
transformers' processor) and the Shape clips generator (what it draws, checked against the
pixels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from test_video_families import build

import vizkit as vk
from vizkit.datasets.user_videos import frame_indices

transformers = pytest.importorskip("transformers")


def test_frame_sampling_uniform_and_strided():
    assert frame_indices(16, 4).tolist() == [2, 6, 10, 14]  # the centres of 4 segments
    assert frame_indices(4, 4).tolist() == [0, 1, 2, 3]
    assert frame_indices(16, 4, sampling=4).tolist() == [0, 4, 8, 12]
    with pytest.raises(ValueError, match="needs 13 frames; the clip has 12"):
        frame_indices(12, 4, sampling=4)
    with pytest.raises(ValueError, match="sampling must be"):
        frame_indices(12, 4, sampling="dense")


@pytest.mark.parametrize("kind", ["videomae", "vivit"])
def test_load_video_equals_the_models_own_processor(kind, tmp_path):
    """Frames written to a folder: the clip the model's own image processor makes of the
    sampled frames (its shorter side resized, centre-cropped, rescaled and normalized, ViViT's
    rescaling to [-1, 1] included) equals ours. The frames' shorter side is the one the
    processor resizes to, so no resampling kernel differs."""
    model = build(kind)
    loaded_size = vk.datasets.model_preprocessing(model)
    shorter = int(32 / loaded_size.crop_pct)  # ViViT's defaults: 224 of 256 (timm floors)
    assert shorter == {"videomae": 32, "vivit": 36}[kind]
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (12, shorter, shorter + 8, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(tmp_path / f"frame_{i:03d}.png")
    loaded = vk.datasets.load_video(tmp_path, model)
    assert loaded.x.shape == (1, 4, 3, 32, 32) and loaded.shown.shape == (1, 4, 32, 32, 3)
    assert loaded.frames.tolist() == [[1, 4, 7, 10]] and loaded.names == [tmp_path.name]
    processor = {"videomae": transformers.VideoMAEImageProcessor,
                 "vivit": transformers.VivitImageProcessor}[kind](
        size={"shortest_edge": shorter}, crop_size={"height": 32, "width": 32}
    )  # fmt: skip
    theirs = processor(list(frames[[1, 4, 7, 10]]), return_tensors="pt").pixel_values
    torch.testing.assert_close(loaded.x, theirs, rtol=0, atol=1e-5)
    from_array = vk.datasets.load_video([frames, torch.from_numpy(frames).permute(0, 3, 1, 2)],
                                        model, sampling=2)  # fmt: skip
    assert from_array.frames.tolist() == [[0, 2, 4, 6]] * 2
    torch.testing.assert_close(from_array.x[0], from_array.x[1])
    vk.attention(model, loaded.x)  # what it makes, the model takes


def test_load_video_refuses_what_it_cannot_read():
    model = build("videomae")
    with pytest.raises(
        ValueError, match=r"takes images, not videos: use vk\.datasets\.load_images"
    ):
        vk.datasets.load_video(np.zeros((4, 32, 32, 3), np.uint8), vk.create_model("test_vit"))
    with pytest.raises(ValueError, match="needs 7 frames; the clip has 3"):
        vk.datasets.load_video(np.zeros((3, 32, 32, 3), np.uint8), model, sampling=2)
    with pytest.raises(ValueError, match=r"\(N, H, W, 3\) or \(N, 3, H, W\)"):
        vk.datasets.load_video(np.zeros((32, 32, 3), np.uint8), model)
    with pytest.raises(FileNotFoundError):
        vk.datasets.load_video("/no/such/folder", model)


def test_shape_clips_draw_the_target_only_where_shown():
    shown = (False, False, True, True)
    clips, labels, masks = vk.datasets.render_shape_clips(
        40, shown=shown, decoys=True, classes=(-1, 1, 4)
    )
    assert clips.shape == (40, 4, 32, 32, 3) and masks.shape == (40, 4, 32, 32)
    assert sorted(set(labels.tolist())) == [-1, 1, 4]
    present = labels >= 0
    assert not masks[:, :2].any() and not masks[~present].any()
    assert (masks[present][:, 2:].sum((-1, -2)) > 20).all()  # every shown target covers pixels
    # the decoys are all that differs from the clips drawn without them: every clip's first
    # frames hold one, and the last frames (the target's) are the same
    plain = vk.datasets.render_shape_clips(40, shown=shown, classes=(-1, 1, 4))
    assert np.array_equal(plain[1], labels) and np.array_equal(plain[2], masks)
    assert np.array_equal(plain[0][:, 2:], clips[:, 2:])
    assert (plain[0][:, 0] != clips[:, 0]).any(-1).sum((-1, -2)).min() > 20
    assert np.array_equal(plain[0][:, 0], plain[0][:, 1])  # a still background
    # the target's pixels hold its colour: one colour per clip and frame, far from the mean
    for b in np.flatnonzero(present)[:5]:
        colours = clips[b, 2][masks[b, 2]]
        assert (colours.max(0).astype(int) - colours.min(0) <= 1).all()
    x, y, m = vk.datasets.shape_clips(4, shown=shown)
    assert x.shape == (4, 4, 3, 32, 32) and x.dtype == torch.float32
    again = vk.datasets.render_shape_clips(40, shown=shown, decoys=True, classes=(-1, 1, 4))
    assert all(np.array_equal(a, b) for a, b in zip((clips, labels, masks), again, strict=True))
    with pytest.raises(ValueError, match="at least one True"):
        vk.datasets.render_shape_clips(2, shown=(False,) * 4)
    with pytest.raises(ValueError, match="or -1"):
        vk.datasets.render_shape_clips(2, classes=(3, 12))
