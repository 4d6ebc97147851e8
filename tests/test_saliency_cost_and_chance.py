"""Saliency comparisons say what they cost and when their scores are noise: the seconds column
covers making the maps and scoring them, long loops show a progress bar that progress=False
silences, and predictions near chance are flagged in the table, its HTML, best() and figures."""

from __future__ import annotations

import time
import warnings

import pytest
import timm
import torch
from tqdm.auto import tqdm

import vizkit as vk
from vizkit.analysis import SaliencyResult
from vizkit.metrics import compare, near_chance, prediction_certainty
from vizkit.widgets import SaliencyComparer

SLEEP = 0.004  # seconds per image the slowed model sleeps in each forward pass


@pytest.fixture(scope="module")
def random_vit():
    """A random-init ViT (10 classes, 32 px, 8 px patches: 16 units) and 2 images, 2 masks."""
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10
    ).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    masks = torch.zeros(2, 32, 32, dtype=torch.bool)
    masks[:, 8:20, 4:16] = True
    return model, x, masks


@pytest.fixture(scope="module")
def shapes():
    model, card = vk.zoo.load("vit_tiny_shapes")
    x, labels, masks = vk.datasets.load_sample()
    return model, x[:4], masks[:4], card["classes"]


def instant(hm, x, targets) -> SaliencyResult:
    """Random maps (B, 4, 4) at no cost: what the method costs is all scoring."""
    maps = torch.rand(len(x), 4, 4, generator=torch.Generator().manual_seed(3))
    return SaliencyResult(maps, "instant", tuple(x.shape[-2:]), targets=targets)


def refused(hm, x, targets) -> SaliencyResult:
    raise ValueError("not for this model")


def quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def test_seconds_cover_scoring(random_vit):
    """Every forward pass sleeps SLEEP per image, so scoring costs at least SLEEP x the images
    scored; the seconds column must hold that (it held the map's time alone before)."""
    model, x, _ = random_vit
    images = []

    def slow(module, args):
        images.append(len(args[0]))
        time.sleep(SLEEP * len(args[0]))

    handle = model.register_forward_pre_hook(slow)
    try:
        start = time.perf_counter()
        table = quiet(
            lambda: vk.compare_saliency(model, x, [("instant", instant)], steps=4, progress=False)
        )
        wall = time.perf_counter() - start
    finally:
        handle.remove()
    ends = images[:3]  # the curves' ends, shared by the methods: the images and 2 baselines
    assert ends == [len(x)] * 3
    scored = sum(images[3:])
    assert scored == 2 * len(x) * 3  # deletion and insertion, the 3 steps between their ends
    assert table.seconds[0] >= SLEEP * scored
    assert table.seconds[0] <= wall
    assert "seconds: making each method's maps and scoring them" in table.to_markdown()


class Recorded(tqdm):
    """A tqdm that keeps each bar's last count and total."""

    bars: list[tuple[str, int, int]] = []

    def close(self):
        Recorded.bars.append((self.desc, self.n, self.total))
        super().close()


def test_progress_bar_shows_and_completes(random_vit, capsys, monkeypatch):
    model, x, masks = random_vit
    quiet(lambda: vk.compare_saliency(model, x, [("instant", instant)], steps=4))
    assert "compare_saliency" in capsys.readouterr().err
    quiet(lambda: vk.compare_saliency(model, x, [("instant", instant)], steps=4, progress=False))
    assert capsys.readouterr().err == ""
    vk.metrics.deletion(model, x, torch.rand(2, 4, 4), steps=4)
    assert "deletion" in capsys.readouterr().err
    vk.metrics.insertion(model, x, torch.rand(2, 4, 4), steps=4, progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(compare, "tqdm", Recorded)
    methods = [("refused", refused), ("instant", instant)]
    quiet(lambda: vk.compare_saliency(model, x, methods, masks=masks, steps=4))
    desc, n, total = Recorded.bars[-1]
    assert desc.startswith("compare_saliency") and n == total == 2 * 2 * 2 * 3
    with pytest.raises(TypeError, match="progress must be True or False"):
        vk.compare_saliency(model, x, ["random"], progress="yes")
    with pytest.raises(TypeError, match="progress must be True or False"):
        vk.metrics.deletion(model, x, torch.rand(2, 4, 4), progress=None)


def test_comparer_shows_progress_only_when_asked(shapes, capsys):
    model, x, masks, _ = shapes
    SaliencyComparer(model, x, masks, methods=["random"])
    assert "compare_saliency" in capsys.readouterr().err
    seen, comparers = [], []

    def spy(hm, images, targets):
        seen.extend(c.status.value for c in comparers)  # the line beside the slider meanwhile
        return instant(hm, images, targets)

    comparer = SaliencyComparer(model, x, masks, methods=[("spy", spy)], progress=False)
    comparers.append(comparer)
    comparer.image.value = 1
    assert capsys.readouterr().err == ""
    assert seen == ["scoring image 1 with 1 method…"]
    table = comparer.table(1)
    assert table.options["steps"] == 8
    assert comparer.status.value == f"image 1 scored in {table.seconds[0]:.1f} s (8-step curves)"


def test_near_chance_flags_uniform_and_tiny_predictions():
    uniform = torch.zeros(1, 1000)
    random_init = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0)) * 0.4
    confident = torch.tensor([[6.0, 0.0, 0.0], [0.0, 5.0, 1.0]])
    assert near_chance(uniform).tolist() == [True]
    assert near_chance(random_init).all()
    assert not near_chance(confident).any()
    assert near_chance(confident, target=[2, 1]).tolist() == [True, False]  # p(2) = 0.0025
    entropy, probability = prediction_certainty(confident, target=[2, 1])
    assert entropy[0] < 0.2 and probability[0] < 0.01 and probability[1] > 0.9
    assert near_chance(torch.tensor([[0.6, 0.4]]).log()).tolist() == [True]  # 60 / 40 of two
    assert near_chance(torch.tensor([[0.9, 0.1]]).log()).tolist() == [False]
    with pytest.raises(ValueError, match="entropy"):
        near_chance(confident, entropy=0)
    with pytest.raises(ValueError, match="out of range"):
        near_chance(confident, target=3)


def test_random_init_table_is_flagged_and_not_ranked(random_vit):
    model, x, masks = random_vit
    with pytest.warns(UserWarning, match="near chance on every image"):
        table = vk.compare_saliency(model, x, ["rollout", "random"], masks=masks, steps=4)
    assert table.near_chance.tolist() == [True, True]
    assert "scores measure noise" in table.caution()
    assert "Caution" in table.to_markdown() and "near chance" in table._repr_html_()
    with pytest.raises(ValueError, match="deletion_auc is not ranked: Predictions near chance"):
        table.best("deletion_auc")
    assert table.best("pointing_game") in table.methods  # the maps against the masks still rank
    shown = vk.viz.display_images(x, model)
    title = vk.viz.saliency_side_by_side(table, shown, image=1).layout.title.text
    assert "Prediction near chance" in title


def test_trained_table_is_not_flagged(shapes):
    model, x, masks, classes = shapes
    table = quiet(lambda: vk.compare_saliency(model, x, ["rollout", "random"], masks=masks))
    assert not table.near_chance.any() and table.caution() == ""
    assert "near chance" not in table._repr_html_() + table.to_markdown()
    assert table.best("deletion_auc") in table.methods
    shown = vk.viz.display_images(x, model)
    title = vk.viz.saliency_side_by_side(table, shown, 0, classes).layout.title.text
    assert "near chance" not in title


def test_steps_default_and_the_heavier_setting(shapes):
    model, x, masks, _ = shapes
    default = quiet(lambda: vk.compare_saliency(model, x[:1], ["random"], progress=False))
    assert default.options["steps"] == 16 and "curves of 16 steps" in default.to_markdown()
    finer = quiet(lambda: vk.compare_saliency(model, x[:1], ["random"], steps=64, progress=False))
    assert finer.options["steps"] == 64 and "curves of 64 steps" in finer._repr_html_()
