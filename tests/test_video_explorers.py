"""Explorers on clips (issue 74, item 3): the zoo's ViViT (clips of 4 frames, tubelets of 2, a
4x4 patch grid) in the AttentionExplorer and the SaliencyComparer, driven through their
controls in the kernel: the frame slider shows that frame with its token frame's map, on one
colour range over the clip; a click picks a (token frame, row, col) patch; the static copy shows
the frames side by side; what does not take clips is not offered, and refused by name where it
is asked for. Then the outlines of a dense target's region (`vizkit.viz.regions`)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from plotly.callbacks import Points
from test_figure_lint import faults

import vizkit as vk
from vizkit.datasets.shape_clips import ShapeClips
from vizkit.viz.regions import contour, target_regions
from vizkit.widgets import AttentionExplorer, SaliencyComparer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def clips():
    model, card = vk.zoo.load("vivit_shape_clips")
    data = ShapeClips("test", n=3)
    return model, torch.stack([data[i][0] for i in range(3)]), data.labels


def maps_of(fig: go.Figure) -> list[np.ndarray]:
    return [np.asarray(t.z, dtype=float) for t in fig.data if isinstance(t, go.Heatmap)]


def test_attention_explorer_shows_the_chosen_frame_on_the_clips_colour_range(clips):
    model, x, _ = clips
    explorer = AttentionExplorer(model, x[:2])
    assert [c.description for c in explorer.controls] == ["clip", "frame", "layer", "head", "view"]
    assert explorer.view.options == ("query row", "rollout")  # class attention takes no clips
    assert explorer.query == "cls"
    rows = vk.attention(model, x[:1], layers=-1).row("cls", heads="mean")[0, 0]  # (2, 4, 4)
    ranges = set()
    for frame in (0, 1, 2, 3):  # frames 0 and 1 are token frame 0's tubelet, 2 and 3 frame 1's
        explorer.frame.value = frame
        (shown,) = maps_of(explorer.figure)
        np.testing.assert_allclose(shown, rows[frame // 2].numpy(), rtol=1e-4, atol=1e-6)
        heat = explorer.figure.data[1]
        ranges.add((heat.zmin, round(heat.zmax, 6)))
        assert f"frame {frame} of 4" in explorer.figure.layout.title.text.replace("<br>", " ")
        state = explorer.figure.get_state()["_widget_data"][1]  # what the page draws
        assert np.allclose(state["z"], shown) and state["zmax"] == heat.zmax
    assert ranges == {(0, round(rows.max().item(), 6))}  # the clip's, whatever the frame
    assert explorer.computed == 1  # moving the frame only redraws


def test_a_click_picks_a_patch_of_the_token_frame_shown(clips):
    model, x, _ = clips
    explorer = AttentionExplorer(model, x[:2])
    explorer.frame.value = 3
    explorer._clicked(explorer.figure.data[1], Points(point_inds=[0], xs=[30], ys=[5]), None)
    assert explorer.query == (1, 0, 3)  # frame 3 is token frame 1's; 8 px patches
    title = explorer.figure.layout.title.text.replace("<br>", " ")
    assert "patch (frame 1, row 0, col 3)" in title
    (outline,) = explorer.figure.layout.shapes
    assert (outline.x0, outline.x1, outline.y0, outline.y1) == (23.5, 31.5, -0.5, 7.5)
    rows = vk.attention(model, x[:1], layers=-1).row((1, 0, 3), heads="mean")[0, 0]
    np.testing.assert_allclose(maps_of(explorer.figure)[0], rows[1].numpy(), rtol=1e-4, atol=1e-6)
    explorer.frame.value = 0
    assert not explorer.figure.layout.shapes  # the query lies in another token frame
    static = explorer.static()
    assert len(maps_of(static)) == 4 and static.layout.coloraxis.cmin == 0
    assert static.layout.coloraxis.cmax == pytest.approx(rows.max().item(), rel=1e-5)
    assert len(static.layout.shapes) == 2  # outlined on frames 2 and 3
    assert [a.text for a in static.layout.annotations] == [f"frame {t}" for t in range(4)]
    assert "click a patch" not in static.layout.title.text
    with pytest.raises(ValueError, match=r"\(token frame, row, col\)"):
        explorer.select((0, 3))
    assert faults(static) == [] and faults(explorer.static()) == []


def test_without_a_class_token_the_query_starts_on_the_clips_centre_patch():
    from test_video_families import clips as random_clips
    from test_video_families import vjepa2

    explorer = AttentionExplorer(vjepa2(), random_clips(1))  # 2 token frames of 4 x 4 patches
    assert explorer.query == (1, 2, 2)
    assert "patch (frame 1, row 2, col 2)" in explorer.figure.layout.title.text.replace("<br>", " ")
    assert not explorer.figure.layout.shapes  # frame 0: token frame 0
    explorer.frame.value = 2
    (outline,) = explorer.figure.layout.shapes
    assert (outline.x0, outline.y0) == (15.5, 15.5)


def test_rollout_of_a_clip_over_its_frames(clips):
    model, x, _ = clips
    explorer = AttentionExplorer(model, x[:2])
    explorer.image.value = 1
    explorer.view.value = "rollout"
    assert explorer.layer.disabled and explorer.head.disabled and not explorer.frame.disabled
    maps = vk.rollout(model, x[1:2]).maps[0]  # (2, 4, 4)
    explorer.frame.value = 1
    heat = explorer.figure.data[1]
    np.testing.assert_allclose(heat.z, maps[0].numpy(), rtol=1e-4, atol=1e-7)
    assert heat.zmin == pytest.approx(maps.min().item(), rel=1e-5)
    assert heat.zmax == pytest.approx(maps.max().item(), rel=1e-5)
    static = explorer.static()
    assert static.layout.title.text.startswith("rollout of clip 1")
    for t, shown in enumerate(maps_of(static)):
        np.testing.assert_allclose(shown, maps[t // 2].numpy(), rtol=1e-4, atol=1e-7)


def test_an_image_model_shows_no_frame_slider():
    model, _ = vk.zoo.load("vit_tiny_shapes")
    images = vk.datasets.load_sample()[0][:2]
    explorer = AttentionExplorer(model, images)
    assert explorer.frame is None
    assert [c.description for c in explorer.controls] == ["image", "layer", "head", "view"]
    assert explorer.view.options == ("query row", "class attention", "rollout")
    assert explorer.static().to_plotly_json()["data"] == go.Figure(explorer.figure).to_plotly_json(
        )["data"]  # fmt: skip
    comparer = SaliencyComparer(model, images, methods=["rollout"], steps=2, progress=False)
    assert comparer.frame is None and comparer.view in comparer.controls


def test_saliency_comparer_shows_each_methods_map_of_the_frame_scaled_over_the_clip(clips):
    model, x, labels = clips
    comparer = SaliencyComparer(model, x[:2], methods=["rollout", "saliency"],
                                target=labels[:2], progress=False)  # fmt: skip
    assert [c.description for c in comparer.controls] == ["clip", "frame", "method", ""]
    assert "the metrics do not take clips yet" in comparer.status.value
    rollout = vk.rollout(model, x[:1]).maps[0]  # (2, 4, 4) token frames
    saliency = vk.saliency(model, x[:1], target=labels[:1]).maps[0]  # (4, 32, 32) frames
    scaled = [(m - m.min()) / (m.max() - m.min()) for m in (rollout, saliency)]
    for frame in (0, 3):
        comparer.frame.value = frame
        shown = maps_of(comparer.figure)
        np.testing.assert_allclose(shown[0], scaled[0][frame // 2].numpy(), atol=1e-5)
        np.testing.assert_allclose(shown[1], scaled[1][frame].numpy(), atol=1e-5)
        axis = comparer.figure.layout.coloraxis
        assert (axis.cmin, axis.cmax) == (0, 1) and "over clip" in axis.colorbar.title.text
    share = vk.saliency(model, x[:1], target=labels[:1]).frame_shares()[0, 3].item()
    assert f"{share:.0%} of |map|" in comparer.figure.layout.annotations[1].text
    comparer.method.value = "saliency"
    (shown,) = maps_of(comparer.figure)
    np.testing.assert_allclose(shown, scaled[1][3].numpy(), atol=1e-5)
    static = comparer.static()
    assert len(maps_of(static)) == 4 and static.layout.title.text == "saliency on clip 0"
    comparer.method.value = "all"
    assert len(maps_of(comparer.static())) == 8  # each method's four frames
    assert comparer.computed == 1  # one clip's maps, whatever is shown
    assert faults(comparer.figure) == [] and faults(comparer.static()) == []


def test_saliency_comparer_refuses_what_does_not_take_clips(clips):
    model, x, _ = clips
    with pytest.raises(ValueError, match=r"\['class_attention'\] do not take clips.*rollout"):
        SaliencyComparer(model, x[:1], methods=["class_attention", "rollout"])
    masks = torch.ones(1, 4, 32, 32, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"leave masks out.*compare_saliency\(model, clips"):
        SaliencyComparer(model, x[:1], masks=masks)
    vk.metrics.compare_saliency(model, x[:1], "rollout", masks=masks, steps=2, progress=False)
    with pytest.raises(ValueError, match="takes videos"):  # still checked as the model's clips
        AttentionExplorer(model, x[0])
    defaults = SaliencyComparer(model, x[:1], methods="default", progress=False).methods
    assert "class_attention" not in defaults and "rollout" in defaults


# ---- outlines of a dense target's region ------------------------------------------------------


def test_a_box_masks_contour_is_the_box_in_pixels():
    mask = vk.targets.box_mask((8, 4, 12, 20), (32, 32))
    xs, ys = contour(mask.numpy(), (32, 32))
    points = {(x, y) for x, y in zip(xs, ys, strict=True) if x is not None}
    assert points == {(3.5, 7.5), (23.5, 7.5), (3.5, 19.5), (23.5, 19.5)}
    xs, ys = contour(mask[::4, ::4].numpy(), (32, 32))  # an 8x8 mask over 32 px: stretched
    assert {x for x in xs if x is not None} == {3.5, 23.5}


def test_the_overlay_outlines_what_a_dense_target_explains():
    model, card = vk.zoo.load("vit_tiny_shapes")
    images, labels, masks = vk.datasets.load_sample()
    shown = vk.viz.display_images(images[:2], model)
    cam = vk.gradcam(model, images[:2], target=labels[:2])
    fig = vk.viz.saliency_overlay(cam, shown, 1, region=masks[:2])
    (line,) = [t for t in fig.data if isinstance(t, go.Scatter)]
    rows, cols = np.nonzero(masks[1].numpy())
    xs, ys = [v for v in line.x if v is not None], [v for v in line.y if v is not None]
    assert (min(xs), max(xs)) == (cols.min() - 0.5, cols.max() + 0.5)
    assert (min(ys), max(ys)) == (rows.min() - 0.5, rows.max() + 0.5)
    assert "outlined (red): the region" in fig.layout.title.text
    near, far = (vk.targets.box_mask(b, (32, 32)) for b in ((0, 0, 8, 8), (16, 16, 8, 8)))
    regions = target_regions(vk.targets.depth_difference(near, far), 0)
    assert [name for name, _ in regions] == ["near", "far"]
    assert [int(r.sum()) for _, r in regions] == [64, 64]
    segment = vk.targets.segment(1, masks[:2].float() * 0.5)  # weights: the pixels > 0
    assert target_regions(segment, 1)[0][1].sum() == masks[1].sum()
    fig = vk.viz.saliency_row(cam, shown, count=2, region=segment)
    assert len([t for t in fig.data if isinstance(t, go.Scatter)]) == 2
    assert "explains class 1 over the mask; outlined (red): the mask" in fig.layout.title.text
    pixel = target_regions(vk.targets.pixel(0, 3, 5, size=(32, 32)), 0)[0][1]
    assert np.argwhere(pixel).tolist() == [[3, 5]]


def test_regions_the_figure_cannot_know_are_refused():
    with pytest.raises(ValueError, match="pass region= a mask"):
        target_regions(vk.targets.segment(1), 0)
    with pytest.raises(ValueError, match="give the target size="):
        target_regions(vk.targets.pixel(0, 3, 5), 0)
    with pytest.raises(ValueError, match="image 2 has no mask"):
        target_regions(torch.ones(2, 4, 4), 2)
    with pytest.raises(TypeError, match="dense target"):
        target_regions(3, 0)
