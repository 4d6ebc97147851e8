"""Metrics over a video model's clips (issue 74): deletion and insertion cut clips in space and
time (a patch unit is a token frame's tubelet of a patch), localization scores a clip's maps
against masks of every frame. Each checked against a hand computation on small random-init
ViViT and TimeSformer models (tubelets of 2 and 1 frames)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vizkit as vk
from vizkit.analysis.saliency_result import rank_descending
from vizkit.metrics.faithfulness import (
    BATCH_PIXELS,
    baseline_images,
    batch_images,
    unit_count,
)

transformers = pytest.importorskip("transformers")

import test_timesformer as timesformer  # noqa: E402
import test_video_families as families  # noqa: E402

TUBELET = {"vivit": 2, "timesformer": 1}


def _model(kind: str):
    return families.build("vivit") if kind == "vivit" else timesformer.build()


def _token_maps(kind: str, batch: int = 2) -> vk.SaliencyResult:
    """Distinct random values on each clip's (T', 4, 4) token cells (no ties to order)."""
    frames = 4 // TUBELET[kind]
    maps = torch.randperm(batch * frames * 16, generator=torch.Generator().manual_seed(3))
    layout = vk.HookedModel(_model(kind)).token_layout((32, 32))
    return vk.SaliencyResult(maps.view(batch, frames, 4, 4).float(), "m", (32, 32), layout=layout)


def _probability(model, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits.softmax(-1).gather(1, target[:, None])[:, 0]


def _curve_by_hand(model, x, cells, counts, fill, target, tubelet) -> torch.Tensor:
    """(B, S + 1) the target's probability with the first ``counts`` units by ``cells``
    (B, U, 4, 4) replaced from ``fill``, a unit = ``tubelet`` frames x an 8 x 8 patch."""
    rank = rank_descending(cells.flatten(1))
    scores = []
    for count in counts:
        chosen = (rank < count).view(cells.shape)  # (B, U, 4, 4)
        pixels = chosen.repeat_interleave(tubelet, 1).repeat_interleave(8, 2)
        pixels = pixels.repeat_interleave(8, 3)[:, :, None]  # (B, T, 1, 32, 32)
        scores.append(_probability(model, torch.where(pixels, fill, x), target))
    return torch.stack(scores, 1)


@pytest.mark.parametrize("kind", ["vivit", "timesformer"])
def test_deletion_over_space_time_units_equals_a_hand_loop(kind):
    model, x, result = _model(kind), families.clips(2), _token_maps(kind)
    curve = vk.metrics.deletion(model, x, result, steps=4, progress=False)
    units = result.maps[0].numel()
    counts = [-(-k * units // 4) for k in range(5)]
    target = curve.targets
    by_hand = _curve_by_hand(model, x, result.maps, counts, torch.zeros_like(x), target,
                             TUBELET[kind])  # fmt: skip
    torch.testing.assert_close(curve.scores, by_hand, atol=1e-5, rtol=1e-4)
    assert curve.options["unit"] == (TUBELET[kind], 8, 8)
    assert curve.fractions.tolist() == [c / units for c in counts]


def test_insertion_from_each_frame_blurred_and_from_the_clips_mean():
    model, x, result = _model("vivit"), families.clips(2), _token_maps("vivit")
    blurred = torch.stack([baseline_images(clip, "blur") for clip in x])
    assert torch.equal(baseline_images(x, "blur"), blurred)  # frames as images
    means = x.mean((1, 3, 4), keepdim=True).expand_as(x)  # each clip's channel means
    assert torch.equal(baseline_images(x, "mean"), means)
    for baseline, start in (("blur", blurred), ("mean", means)):
        curve = vk.metrics.insertion(model, x, result, steps=4, baseline=baseline,
                                     progress=False)  # fmt: skip
        counts = [-(-k * 32 // 4) for k in range(5)]
        # insertion reveals the clip's units on the baseline: the baseline's units replaced
        by_hand = _curve_by_hand(model, start, result.maps, counts, x, curve.targets, 2)
        torch.testing.assert_close(curve.scores, by_hand, atol=1e-5, rtol=1e-4)


def test_pixel_maps_score_as_their_mean_over_each_unit():
    """A map of every frame's pixels (B, T, H, W) ranks units by its mean over each unit's
    tubelet frames and patch pixels: its curve equals that of the token map of those means."""
    model, x = _model("vivit"), families.clips(2)
    pixels = torch.rand(2, 4, 32, 32, generator=torch.Generator().manual_seed(5))
    result = vk.SaliencyResult(pixels, "m", (32, 32), frames=4)
    means = pixels.view(2, 2, 2, 4, 8, 4, 8).mean((2, 4, 6))  # (B, T', 4, 4)
    tokens = vk.SaliencyResult(means, "m", (32, 32), frames=2)
    pixel_curve = vk.metrics.deletion(model, x, result, steps=8, progress=False)
    token_curve = vk.metrics.deletion(model, x, tokens, steps=8, progress=False)
    torch.testing.assert_close(pixel_curve.scores, token_curve.scores)
    fine = vk.metrics.deletion(model, x, result, steps=8, level="pixel", progress=False)
    assert fine.options["unit"] == (1, 1, 1) and fine.scores.shape == (2, 9)


def _masks(frames: list[int], rows: slice, cols: slice, batch: int = 2) -> torch.Tensor:
    masks = torch.zeros(batch, 4, 32, 32, dtype=torch.bool)
    for t in frames:
        masks[:, t, rows, cols] = True
    return masks


def test_localization_reads_the_clips_pixels_of_every_frame():
    """Energy in the mask by hand: each token frame's map on both frames of its tubelet,
    upsampled bilinearly frame by frame, its positive share on the mask."""
    result = _token_maps("vivit")
    masks = _masks([1, 2], slice(4, 20), slice(8, 30))
    per_frame = result.maps.repeat_interleave(2, 1)  # (B, 4, 4, 4)
    up = F.interpolate(per_frame, size=(32, 32), mode="bilinear").clamp_min(0)
    expected = (up * masks).flatten(1).sum(1) / up.flatten(1).sum(1)
    torch.testing.assert_close(vk.metrics.energy_in_mask(result, masks), expected)
    assert vk.metrics.relevance_mass_accuracy(result, masks).tolist() == expected.tolist()
    top = rank_descending(up.flatten(1)) < masks.flatten(1).sum(1)[:, None]
    rank = (top & masks.flatten(1)).sum(1) / masks.flatten(1).sum(1)
    torch.testing.assert_close(vk.metrics.relevance_rank_accuracy(result, masks), rank.float())


def test_the_pointing_game_finds_the_clips_peak_in_its_own_frame():
    maps = torch.zeros(1, 2, 4, 4)
    maps[0, 1, 2, 3] = 1.0  # token frame 1 (frames 2 and 3), cell (2, 3): pixels 16-23, 24-31
    result = vk.SaliencyResult(maps, "m", (32, 32), frames=2)
    on_peak = _masks([3], slice(16, 24), slice(24, 32), batch=1)
    elsewhere = _masks([0], slice(16, 24), slice(24, 32), batch=1)  # same place, another frame
    near = _masks([2], slice(0, 8), slice(24, 32), batch=1)  # above the peak, its frame
    assert vk.metrics.pointing_game(result, on_peak).item() == 1.0
    assert vk.metrics.pointing_game(result, elsewhere, tolerance=20).item() == 0.0
    assert vk.metrics.pointing_game(result, near).item() == 0.0
    assert vk.metrics.pointing_game(result, near, tolerance=12).item() == 1.0


def test_sparseness_and_complexity_read_every_frame():
    maps = torch.zeros(1, 2, 4, 4)
    maps[0, 1, 0, 0] = 3.0
    result = vk.SaliencyResult(maps, "m", (32, 32), frames=2)
    assert abs(vk.metrics.sparseness(result).item() - 31 / 32) < 1e-9  # one cell of 32
    assert abs(vk.metrics.complexity(result).item()) < 1e-9


def test_clips_and_images_are_not_scored_against_each_other():
    model, x, result = _model("vivit"), families.clips(2), _token_maps("vivit")
    with pytest.raises(
        ValueError, match=r"video's \(B, 2, h, w\), but they are scored against masks of images"
    ):
        vk.metrics.energy_in_mask(result, torch.ones(2, 32, 32, dtype=torch.bool))
    image_maps = vk.SaliencyResult(torch.rand(2, 4, 4), "m", (32, 32))
    with pytest.raises(ValueError, match=r"images' \(B, h, w\), but .* against masks of 4 frames"):
        vk.metrics.energy_in_mask(image_maps, _masks([0], slice(0, 8), slice(0, 8)))
    three = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match="maps of 3 frames do not tile clips of 4 frames"):
        vk.metrics.energy_in_mask(three, _masks([0], slice(0, 8), slice(0, 8)))
    with pytest.raises(ValueError, match=r"images' \(B, h, w\), but .* against clips of 4 frames"):
        vk.metrics.deletion(model, x, image_maps, steps=2, progress=False)
    with pytest.raises(ValueError, match=r"masks of samples \[1\] have no object pixel"):
        empty = _masks([0], slice(0, 8), slice(0, 8))
        empty[1] = False
        vk.metrics.energy_in_mask(result, empty)
    vit = vk.create_model("test_vit")
    with pytest.raises(
        ValueError, match=r"video's \(B, 2, h, w\), but .* against images \(B, C, H, W\)"
    ):
        vk.metrics.deletion(vit, torch.randn(2, 3, 32, 32), result, steps=2, progress=False)


def test_unit_count_and_batches_count_every_frame():
    model = _model("vivit")
    assert unit_count(model, (32, 32), "patch") == 2 * 16
    assert unit_count(model, (32, 32), "pixel") == 4 * 32 * 32
    assert batch_images(None, families.clips(1), model) == BATCH_PIXELS // (4 * 32 * 32)


def test_compare_saliency_scores_clips_as_the_metrics_do_one_by_one():
    model, x = _model("vivit"), families.clips(2)
    masks = _masks([2, 3], slice(8, 24), slice(0, 16))
    with pytest.warns(UserWarning, match="near chance"):  # a random-init model
        table = vk.metrics.compare_saliency(model, x, methods=["rollout", "saliency"],
                                            masks=masks, steps=4, progress=False)  # fmt: skip
    for j, name in enumerate(table.methods):
        result = table.results[name]
        deleted = vk.metrics.deletion(model, x, result, steps=4, progress=False).auc
        torch.testing.assert_close(table.per_image[j, 0], deleted, atol=1e-6, rtol=1e-5)
        energy = vk.metrics.energy_in_mask(result, masks)
        torch.testing.assert_close(table.per_image[j, table.metrics.index("energy_in_mask")],
                                   energy)  # fmt: skip
    display = vk.viz.display_images(x, model)
    with pytest.raises(ValueError, match=r"clips' \(B, 2, h, w\).*vk\.viz\.video_saliency"):
        vk.viz.saliency_side_by_side(table, display)  # one image a panel
    vk.viz.video_saliency(table.results["rollout"], display, clip=1)  # the fix it names
    with pytest.warns(UserWarning, match="near chance"):
        every = vk.metrics.compare_saliency(model, x, methods="rollout", masks=masks, steps=4,
                                            metrics="all", progress=False)  # fmt: skip
    assert "road_morf_auc" not in every.metrics and "sparseness" in every.metrics
    assert not torch.isnan(every.per_image).any()
    with pytest.raises(ValueError, match=r"\['road_morf_auc'\] score images and do not take"):
        vk.metrics.compare_saliency(model, x, methods="rollout", metrics=["road_morf_auc"])
    with pytest.raises(ValueError, match=r"masks must be \(B, T, H, W\) = \(2, 4, 32, 32\)"):
        vk.metrics.compare_saliency(model, x, methods="rollout", masks=masks[:, 2])


def test_evaluate_over_shape_clips_leaves_clips_without_an_object_out_of_the_mask_metrics():
    """ShapeClips of class "none" show no object: the mask metrics leave them out (noted),
    the curves score them; every score equals `compare_saliency` on the same batch."""
    from vizkit.datasets.shape_clips import ShapeClips

    model, data = _model("vivit"), ShapeClips("test", n=8)
    x = torch.stack([data[i][0] for i in range(8)])
    masks = torch.stack([data[i][2] for i in range(8)])
    empty = (~masks.flatten(1).any(1)).nonzero()[:, 0].tolist()
    assert empty and len(empty) < 4, empty  # the test set's first 8 hold both kinds
    table = vk.metrics.evaluate(model, data, methods=["rollout"], batch_size=8, steps=4,
                                targets="predictions", progress=False)  # fmt: skip
    energy = table.per_image[0, table.metrics.index("energy_in_mask")]
    assert torch.isnan(energy[empty]).all() and not torch.isnan(energy).all()
    assert not torch.isnan(table.per_image[0, table.metrics.index("deletion_auc")]).any()
    assert f"samples {empty}" in table.notes["rollout/no object"]
    placed = [i for i in range(8) if i not in empty]
    result = vk.rollout(model, x[placed])
    torch.testing.assert_close(energy[placed], vk.metrics.energy_in_mask(result, masks[placed]))
