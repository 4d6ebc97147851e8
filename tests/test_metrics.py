"""Deletion/insertion curves, localization scores and compare_saliency."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import build

import vizkit as vk
from vizkit.datasets import load_sample
from vizkit.metrics import faithfulness
from vizkit.metrics.table import SaliencyTable


@pytest.fixture(scope="module")
def shapes():
    x, labels, masks = load_sample()
    model, _ = vk.zoo.load("vit_tiny_shapes")
    return model, x[:16], labels[:16], masks[:16]


def _loop_deletion(model, x, maps, target, unit, steps, baseline):
    """Deletion for one image, one perturbed image at a time."""
    cells = maps.flatten()
    order = np.argsort(-cells.numpy(), kind="stable")
    scores = []
    for k in range(steps + 1):
        count = math.ceil(k * len(order) / steps)
        image = x.clone()
        for index in order[:count]:
            r, c = divmod(int(index), maps.shape[-1])
            rows = slice(r * unit, (r + 1) * unit)
            cols = slice(c * unit, (c + 1) * unit)
            image[:, rows, cols] = baseline[:, rows, cols]
        with torch.no_grad():
            scores.append(model(image[None]).softmax(-1)[0, target].item())
    return np.array(scores)


def test_deletion_equals_a_loop():
    model, x = build("vit")
    grid = vk.token_layout(model, x.shape[-2:]).grid
    maps = torch.rand(2, *grid, generator=torch.Generator().manual_seed(0))
    curve = vk.metrics.deletion(model, x, maps, target=[3, 7], steps=8, batch_size=5)
    unit = model.patch_embed.patch_size[0]
    for b, target in enumerate([3, 7]):
        expected = _loop_deletion(model, x[b], maps[b], target, unit, 8, torch.zeros_like(x[b]))
        np.testing.assert_allclose(curve.scores[b].numpy(), expected, rtol=1e-4, atol=1e-6)
        fractions = (
            np.array([math.ceil(k * maps[b].numel() / 8) for k in range(9)]) / maps[b].numel()
        )
        np.testing.assert_allclose(
            curve.auc[b].item(), np.trapezoid(expected, fractions), rtol=1e-4
        )


def test_insertion_starts_at_the_baseline_and_ends_at_the_image():
    model, x = build("vit")
    maps = torch.rand(2, 32, 32)  # pixel maps are pooled to patches
    curve = vk.metrics.insertion(model, x, maps, steps=4, baseline="mean")
    with torch.no_grad():
        clean = model(x).softmax(-1)
        base = model(faithfulness.baseline_images(x, "mean")).softmax(-1)
    targets = clean.argmax(-1)
    torch.testing.assert_close(curve.scores[:, -1], clean[[0, 1], targets])
    torch.testing.assert_close(curve.scores[:, 0], base[[0, 1], targets])
    assert curve.fractions[0] == 0 and curve.fractions[-1] == 1


def test_pixel_level_has_pixel_units():
    model, x = build("vit")
    curve = vk.metrics.deletion(model, x, torch.rand(2, 4, 4), level="pixel", steps=16)
    assert curve.options["unit"] == (1, 1) and curve.scores.shape == (2, 17)


def test_blur_baseline_is_smooth_and_keeps_the_mean():
    x = torch.randn(2, 3, 32, 32)
    blurred = faithfulness.baseline_images(x, "blur")
    assert blurred.shape == x.shape
    assert blurred.std() < x.std() / 2
    with pytest.raises(ValueError, match="baseline must be one of"):
        faithfulness.baseline_images(x, "noise")


def test_oracle_saliency_beats_random_on_shapes(shapes):
    model, x, labels, masks = shapes
    oracle = masks.float()  # the object itself
    noise = torch.rand(masks.shape, generator=torch.Generator().manual_seed(0))
    for level in ("patch", "pixel"):
        oracle_del = vk.metrics.deletion(model, x, oracle, target=labels, level=level).auc
        noise_del = vk.metrics.deletion(model, x, noise, target=labels, level=level).auc
        assert oracle_del.mean() < noise_del.mean() - 0.1
        oracle_ins = vk.metrics.insertion(model, x, oracle, target=labels, level=level).auc
        noise_ins = vk.metrics.insertion(model, x, noise, target=labels, level=level).auc
        assert oracle_ins.mean() > noise_ins.mean() + 0.1


def test_localization_of_the_mask_itself_is_perfect(shapes):
    _, _, _, masks = shapes
    oracle = masks.float()
    assert vk.metrics.pointing_game(oracle, masks).eq(1).all()
    torch.testing.assert_close(vk.metrics.energy_in_mask(oracle, masks), torch.ones(len(masks)))
    torch.testing.assert_close(vk.metrics.top_iou(oracle, masks), torch.ones(len(masks)))
    inverse = 1 - oracle
    assert vk.metrics.pointing_game(inverse, masks).eq(0).all()
    assert vk.metrics.top_iou(inverse, masks).eq(0).all()


def test_pointing_game_tolerance_and_iou_fraction():
    masks = torch.zeros(1, 8, 8, dtype=torch.bool)
    masks[0, 2:4, 2:4] = True
    maps = torch.zeros(1, 8, 8)
    maps[0, 5, 5] = 1  # two pixels away from the object
    assert vk.metrics.pointing_game(maps, masks).item() == 0
    assert vk.metrics.pointing_game(maps, masks, tolerance=2).item() == 1
    top = torch.zeros(1, 8, 8)
    top[0, 2:4, 2:6] = torch.tensor([[4.0, 3, 2, 1], [4, 3, 2, 1]])
    # top 8 of 64 pixels: the 4 object pixels + 4 outside -> IoU 4 / 8
    assert vk.metrics.top_iou(top, masks, fraction=8 / 64).item() == pytest.approx(0.5)


def test_pointing_game_breaks_a_rounding_tie_the_same_on_every_cpu():
    """Pixels equal but for rounding (a peak on the grid's border upsamples to two, and an AVX2
    kernel made the outer one larger by an ulp where AVX-512 made them equal) tie: the first
    decides, whichever is a last bit larger."""
    masks = torch.zeros(1, 8, 8, dtype=torch.bool)
    masks[0, 2:4, 2:4] = True
    peak = torch.tensor(0.3)
    for inside, outside in ((peak, peak.nextafter(torch.tensor(1.0))),
                            (peak.nextafter(torch.tensor(1.0)), peak)):  # fmt: skip
        maps = torch.zeros(1, 8, 8)
        maps[0, 3, 3], maps[0, 3, 4] = inside, outside
        assert vk.metrics.pointing_game(maps, masks).item() == 1
    maps[0, 3, 4] = peak * 1.001  # a real difference is no tie
    assert vk.metrics.pointing_game(maps, masks).item() == 0
    grid = torch.zeros(1, 8, 8)
    grid[0, 4, 7] = 1.0  # on the right border: pixel columns 30 and 31 of 32 tie
    on_30, on_31 = torch.zeros(2, 1, 32, 32, dtype=torch.bool)
    on_30[0, 16:20, 30], on_31[0, 16:20, 31] = True, True
    assert vk.metrics.pointing_game(grid, on_30).item() == 1
    assert vk.metrics.pointing_game(grid, on_31).item() == 0


def test_shape_mismatches_are_clear(shapes):
    model, x, labels, masks = shapes
    with pytest.raises(ValueError, match="Expected 16 saliency maps"):
        vk.metrics.energy_in_mask(torch.rand(3, 8, 8), masks)
    with pytest.raises(ValueError, match="do not tile"):
        vk.metrics.energy_in_mask(torch.rand(len(masks), 7, 8), masks)
    with pytest.raises(ValueError, match="do not tile"):
        vk.metrics.deletion(model, x, torch.rand(len(x), 5, 5))
    with pytest.raises(ValueError, match="bool or hold only 0 and 1"):
        vk.metrics.pointing_game(torch.rand(len(masks), 8, 8), masks.float() * 0.5)
    vk.metrics.pointing_game(torch.rand(len(masks), 8, 8), masks.float())  # 0/1 is fine
    with pytest.raises(ValueError, match="Expected 16 saliency maps"):
        vk.metrics.deletion(model, x, torch.rand(3, 8, 8))
    with pytest.raises(ValueError, match="level must be"):
        vk.metrics.deletion(model, x, masks.float(), level="token")
    with pytest.raises(ValueError, match="out of range"):
        vk.metrics.deletion(model, x, masks.float(), target=10)


def test_compare_saliency_table(shapes):
    model, x, labels, masks = shapes
    table = vk.compare_saliency(
        model, x, methods=["rollout", "gradcam", "random"], masks=masks, target=labels
    )
    assert table.methods == ["rollout", "gradcam", "random"]
    assert table.mean.shape == (3, 5) and not table.mean.isnan().any()
    assert "| rollout |" in table.to_markdown()
    assert table.best("deletion_auc") in table.methods
    cnn, _ = vk.zoo.load("resnet_tiny_shapes")
    with pytest.warns(UserWarning, match="rollout skipped"):
        table = vk.compare_saliency(cnn, x, methods=["rollout", "gradcam"])
    assert table.mean[0].isnan().all() and "rollout" in table.notes
    with pytest.raises(KeyError, match="known: [a-z_, ]*rollout"):
        vk.compare_saliency(model, x, methods=["lime"])


def test_curve_ends_are_reused_computed_when_missing_and_checked():
    model, x = build("vit")
    hm = vk.HookedModel(model)
    maps = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ends = faithfulness.CurveEnds.compute(model, x, ["zero"], batch_size=1)
    plain = vk.metrics.insertion(model, x, maps, steps=4, progress=False)
    images = []
    handle = model.register_forward_pre_hook(lambda module, args: images.append(len(args[0])))
    try:
        shared = faithfulness.perturbation_curve(
            "insertion", hm, x, maps, None, "patch", "blur", 4, None, False, ends
        )
    finally:
        handle.remove()
    assert images == [2, 2 * 3]  # the missing blur baseline, then the 3 inner steps
    assert "blur" in ends.baselines
    torch.testing.assert_close(shared.scores, plain.scores)
    with pytest.raises(ValueError, match="ends are of 2 images, not 1"):
        faithfulness.perturbation_curve(
            "deletion", hm, x[:1], maps[:1], None, "patch", "zero", 4, None, False, ends
        )


def test_saliency_table_ranks_methods_by_the_metrics_each_has():
    """Mean rank over the metrics a method has (ties share their mean rank); the curves are
    not ranked when every prediction is near chance."""
    nan = float("nan")
    values = torch.tensor(
        [[0.2, 0.6, 1.0], [0.1, 0.6, nan], [0.3, 0.9, 0.0], [nan, nan, nan]]
    )  # deletion (lower better), insertion, pointing game
    table = SaliencyTable(
        ["a", "b", "c", "skipped"], ["deletion_auc", "insertion_auc", "pointing_game"],
        values[..., None], [1.0] * 4, {"skipped": "no attention"},
    )  # fmt: skip
    # a: deletion 2, insertion 2.5 (tie with b), pointing 1 -> 5.5/3; b: 1, 2.5 -> 1.75;
    # c: 3, 1, 2 -> 2
    assert table.mean_ranks()[:3] == pytest.approx([5.5 / 3, 1.75, 2.0])
    assert math.isnan(table.mean_ranks()[3])
    assert table.ranking() == ["b", "a", "c"]
    assert "| mean rank ↓ |" in table.to_markdown() and "mean rank" in table._repr_html_()
    table.near_chance = torch.tensor([True, True])
    assert table.ranking() == ["a", "c"]  # only the pointing game, which b lacks


def test_evaluation_bars_say_which_images_are_near_chance_and_what_is_not_ranked():
    """Some images near chance: the title names them and every panel is ranked; all of them:
    the curves' panels are not ranked and the title says so; an unregistered metric: its panel
    says why it is not ranked."""
    values = torch.tensor([[0.2, 0.6, 1.0], [0.1, 0.5, 0.0]])[..., None].expand(2, 3, 2)

    def bars(near_chance, metrics=("deletion_auc", "insertion_auc", "pointing_game")):
        table = SaliencyTable(["a", "b"], list(metrics), values, [1.0] * 2, {})
        table.near_chance = torch.tensor(near_chance)
        table.target_probability = table.prediction_entropy = torch.tensor([0.5, 0.5])
        figure = vk.viz.evaluation_bars(table)
        return figure.layout.title.text, [a.text for a in figure.layout.annotations]

    title, panels = bars([True, False])
    assert "near chance on images [0]" in title
    assert "not ranked" not in title and all("best: " in p for p in panels)
    title, panels = bars([True, True])
    assert "near chance on every image: curves not ranked" in title
    assert [p.split("<br>")[1] for p in panels] == [
        "not ranked: near chance",
        "not ranked: near chance",
        "best: a",
    ]
    _, panels = bars([False, False], ("deletion_auc", "insertion_auc", "my_metric"))
    assert panels[2].endswith("not ranked: unregistered")


def test_compare_saliency_runs_every_registered_method(shapes):
    model, x, labels, masks = shapes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the methods that do not apply are noted
        table = vk.compare_saliency(model, x[:2], methods="all", target=labels[:2], steps=2)
    assert table.methods[-1] == "random" and set(table.methods) == set(vk.methods.METHODS)
    skipped = {m for i, m in enumerate(table.methods) if table.mean[i].isnan().all()}
    assert skipped <= set(table.notes) and "attnlrp" not in skipped
    assert set(table.ranking()) == set(table.methods) - skipped
    default = vk.compare_saliency(model, x[:2], methods="default", steps=2)
    assert default.methods == vk.methods.default_methods(True)
    assert {"attnlrp", "gradcam", "rollout"} <= set(default.methods)
