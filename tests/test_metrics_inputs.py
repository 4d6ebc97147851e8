"""Saliency metrics refuse what they cannot score (no silent wrong answers) and run the model
under the analysis contract (wrappers unwrapped, eval mode, training flags restored)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import timm
import torch
from torch import nn

import vizkit as vk
from vizkit.analysis import SaliencyResult
from vizkit.methods.random_saliency import random_saliency
from vizkit.metrics import (
    compare_saliency,
    deletion,
    energy_in_mask,
    insertion,
    pointing_game,
    top_iou,
)
from vizkit.metrics.localization import pixel_maps
from vizkit.metrics.table import SaliencyTable

B, SIZE, GRID = 2, 32, 4  # 32x32 images, 8x8 patches: a 4x4 grid of 16 units


def tiny_vit(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", img_size=SIZE, patch_size=8, depth=2, num_classes=4, **kwargs
    )


@pytest.fixture(scope="module")
def inputs() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A tiny ViT in eval mode, images (2, 3, 32, 32) and object masks (2, 32, 32) bool."""
    x = torch.randn(B, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    masks = torch.zeros(B, SIZE, SIZE, dtype=torch.bool)
    masks[:, 8:20, 4:16] = True
    return tiny_vit().eval(), x, masks


def maps(*shape: int, bad: float | None = None) -> torch.Tensor:
    """Random maps of ``shape`` (default (2, 4, 4)); ``bad`` written into sample 1."""
    m = torch.rand(*(shape or (B, GRID, GRID)), generator=torch.Generator().manual_seed(2))
    if bad is not None:
        m[1, 0, 0] = bad
    return m


def soft_masks(masks: torch.Tensor) -> torch.Tensor:
    return masks.float() * 0.5


def no_object(masks: torch.Tensor) -> torch.Tensor:
    masks = masks.clone()
    masks[1] = False
    return masks


def with_nan(t: torch.Tensor) -> torch.Tensor:
    """A float copy of ``t`` with a NaN in sample 1."""
    t = t.float().clone()
    t[1].view(-1)[0] = float("nan")
    return t


def big_result() -> SaliencyResult:
    return SaliencyResult(maps(), "rollout", (64, 64))


def nan_method(hm, x, targets) -> SaliencyResult:
    return SaliencyResult(maps(bad=float("nan")), "nan", tuple(x.shape[-2:]))


CURVES = {"deletion": deletion, "insertion": insertion}
LOCALIZATION = {
    "pointing_game": pointing_game,
    "energy_in_mask": energy_in_mask,
    "top_iou": top_iou,
    "pixel_maps": pixel_maps,
}

# each case: (call, exception, phrase of the message)
CURVE_CASES = [
    pytest.param(
        lambda f, m, x: f(m, x, maps(bad=float("nan"))),
        ValueError,
        "NaN values (samples [1])",
        id="nan maps",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(bad=float("inf"))),
        ValueError,
        "Inf values (samples [1])",
        id="inf maps",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(3, 4, 4)),
        ValueError,
        "Expected 2 saliency maps",
        id="maps batch",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(0, 4, 4)), ValueError, "maps are empty", id="empty maps"
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(2, 1, 4, 4)), ValueError, "maps[:, 0]", id="maps 4-D"
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps().numpy()), TypeError, "torch.from_numpy", id="maps numpy"
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(2, 5, 5)), ValueError, "do not tile", id="maps not tiling"
    ),
    pytest.param(
        lambda f, m, x: f(m, x, big_result()), ValueError, "computed for 64x64", id="result size"
    ),
    pytest.param(
        lambda f, m, x: f(m, with_nan(x), maps()), ValueError, "images hold NaN", id="nan images"
    ),
    pytest.param(
        lambda f, m, x: f(m, x[:0], maps()), ValueError, "batch is empty", id="empty images"
    ),
    pytest.param(
        lambda f, m, x: f(m, x.long(), maps()), TypeError, "floating-point", id="int images"
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), steps=0),
        ValueError,
        "steps must be an int >= 1",
        id="steps 0",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), steps=2.5),
        TypeError,
        "steps must be an int",
        id="steps float",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), steps=17),
        ValueError,
        "more than the 16 patch units",
        id="steps > units",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), batch_size=0),
        ValueError,
        "batch_size must be an int >= 1",
        id="batch_size 0",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), level="token"),
        ValueError,
        "level must be one of 'patch', 'pixel'",
        id="level",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), baseline="noise"),
        ValueError,
        "baseline must be one of 'blur', 'mean', 'zero'",
        id="baseline",
    ),
    pytest.param(
        lambda f, m, x: f(m, x, maps(), target=9), ValueError, "out of range", id="target"
    ),
]

LOCALIZATION_CASES = [
    pytest.param(
        lambda f, k: f(maps(bad=float("nan")), k),
        ValueError,
        "NaN values (samples [1])",
        id="nan maps",
    ),
    pytest.param(
        lambda f, k: f(maps(3, 4, 4), k), ValueError, "Expected 2 saliency maps", id="maps batch"
    ),
    pytest.param(lambda f, k: f(maps(0, 4, 4), k), ValueError, "maps are empty", id="empty maps"),
    pytest.param(
        lambda f, k: f(maps(2, 5, 5), k),
        ValueError,
        "do not tile the 32x32 masks",
        id="maps not tiling",
    ),
    pytest.param(
        lambda f, k: f(big_result(), k),
        ValueError,
        "but the masks given are 32x32",
        id="result size",
    ),
    pytest.param(
        lambda f, k: f(maps(), soft_masks(k)), ValueError, "only 0 and 1", id="soft masks"
    ),
    pytest.param(
        lambda f, k: f(maps(), k.long() * 2),
        ValueError,
        "samples [0, 1] hold other values",
        id="int masks",
    ),
    pytest.param(lambda f, k: f(maps(), with_nan(k)), ValueError, "masks hold NaN", id="nan masks"),
    pytest.param(lambda f, k: f(maps(), k[:, None]), ValueError, "masks[:, 0]", id="masks 4-D"),
    pytest.param(
        lambda f, k: f(maps(0, 4, 4), k[:0]), ValueError, "masks are empty", id="empty masks"
    ),
    pytest.param(
        lambda f, k: f(maps(), no_object(k)),
        ValueError,
        "samples [1] have no object pixel",
        id="no object",
    ),
    pytest.param(
        lambda f, k: f(maps(), k.numpy()), TypeError, "torch.from_numpy", id="masks numpy"
    ),
]

OPTION_CASES = [
    pytest.param(
        lambda m, x, k: pointing_game(maps(), k, tolerance=-1),
        ValueError,
        "tolerance must be an int >= 0",
        id="tolerance -1",
    ),
    pytest.param(
        lambda m, x, k: pointing_game(maps(), k, tolerance=1.5),
        TypeError,
        "tolerance must be an int",
        id="tolerance float",
    ),
    pytest.param(
        lambda m, x, k: top_iou(maps(), k, fraction=0),
        ValueError,
        "fraction must be a number in (0, 1]",
        id="fraction 0",
    ),
    pytest.param(
        lambda m, x, k: top_iou(maps(), k, fraction=1.5),
        ValueError,
        "fraction must be a number in (0, 1]",
        id="fraction 1.5",
    ),
    pytest.param(
        lambda m, x, k: top_iou(maps(), k, fraction=float("nan")),
        ValueError,
        "fraction must be",
        id="fraction nan",
    ),
    pytest.param(
        lambda m, x, k: random_saliency(m, x, seed=-1),
        ValueError,
        "seed must be an int in [0, ",
        id="seed -1",
    ),
    pytest.param(
        lambda m, x, k: random_saliency(m, x, seed=0.5),
        TypeError,
        "seed must be an int",
        id="seed float",
    ),
    pytest.param(
        lambda m, x, k: random_saliency(m, with_nan(x)),
        ValueError,
        "images hold NaN",
        id="random nan images",
    ),
    pytest.param(
        lambda m, x, k: random_saliency(m, x, target=9),
        ValueError,
        "out of range",
        id="random target",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, []),
        ValueError,
        "methods is empty; pass at least one of ablationcam",
        id="compare no methods",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, "lime"),  # a string is one method's name
        KeyError,
        "known: ablationcam",
        id="compare str methods",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["lime"]),
        KeyError,
        "known: ablationcam",
        id="compare unknown",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["random", "random"]),
        ValueError,
        "['random'] appear more than once",
        id="compare repeated",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, [("mine", 3)]),
        TypeError,
        "(name, fn(hm, x, targets)",
        id="compare bad pair",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, [("mine", lambda *a: maps())]),
        TypeError,
        "must return a SaliencyResult",
        id="compare not a result",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["random"], masks=k[:1]),
        ValueError,
        "masks must be (B, H, W) = (2, 32, 32)",
        id="compare masks batch",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["random"], masks=soft_masks(k)),
        ValueError,
        "only 0 and 1",
        id="compare soft masks",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["random"], level="token"),
        ValueError,
        "level must be one of",
        id="compare level",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["random"], steps=17),
        ValueError,
        "more than the 16 patch units",
        id="compare steps",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, with_nan(x), ["random"]),
        ValueError,
        "images hold NaN",
        id="compare nan images",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x[:0], ["random"]),
        ValueError,
        "batch is empty",
        id="compare empty images",
    ),
    pytest.param(
        lambda m, x, k: compare_saliency(m, x, ["random"], target=9),
        ValueError,
        "out of range",
        id="compare target",
    ),
    pytest.param(
        lambda m, x, k: SaliencyResult(maps().numpy(), "m", (32, 32)),
        TypeError,
        "maps must be a tensor",
        id="result maps numpy",
    ),
    pytest.param(
        lambda m, x, k: SaliencyResult(maps(), "m", (0, 32)),
        ValueError,
        "image_size must be an int >= 1",
        id="result image_size",
    ),
]


def _raises(exception: type[Exception], phrase: str):
    return pytest.raises(exception, match=re.escape(phrase))


@pytest.mark.parametrize("metric", list(CURVES))
@pytest.mark.parametrize(("call", "exception", "phrase"), CURVE_CASES)
def test_curves_refuse_bad_inputs(inputs, metric, call, exception, phrase):
    model, x, _ = inputs
    with _raises(exception, phrase):
        call(CURVES[metric], model, x)


@pytest.mark.parametrize("metric", list(LOCALIZATION))
@pytest.mark.parametrize(("call", "exception", "phrase"), LOCALIZATION_CASES)
def test_localization_refuses_bad_inputs(inputs, metric, call, exception, phrase):
    _, _, masks = inputs
    with _raises(exception, phrase):
        call(LOCALIZATION[metric], masks)


@pytest.mark.parametrize(("call", "exception", "phrase"), OPTION_CASES)
def test_options_and_compare_refuse_bad_inputs(inputs, call, exception, phrase):
    model, x, masks = inputs
    with _raises(exception, phrase):
        call(model, x, masks)


def test_valid_edge_values_are_accepted(inputs):
    model, x, masks = inputs
    assert deletion(model, x, maps(), steps=16, batch_size=1).scores.shape == (B, 17)
    assert insertion(model, x, maps()).options["steps"] == 16  # None: min(64, units)
    assert top_iou(maps(), masks, fraction=1.0).shape == (B,)
    assert pointing_game(maps(), masks.long(), tolerance=0).shape == (B,)  # 0/1 integers
    assert random_saliency(model, x, seed=2**64 - 1).maps.shape == (B, SIZE, SIZE)


def test_compare_skips_a_method_with_non_finite_maps(inputs):
    model, x, masks = inputs
    with pytest.warns(UserWarning, match=re.escape("nan skipped: The saliency maps hold NaN")):
        table = compare_saliency(model, x, ["random", ("nan", nan_method)], masks=masks)
    assert not table.mean[0].isnan().any() and table.mean[1].isnan().all()
    assert "samples [1]" in table.notes["nan"] and "nan" not in table.results
    assert table.best("pointing_game") == "random"


def test_best_refuses_unknown_or_unscored_metrics():
    nan = torch.full((1, 2, 1), float("nan"))
    table = SaliencyTable(["a"], ["deletion_auc", "insertion_auc"], nan, [float("nan")], {})
    with _raises(ValueError, "metric must be one of 'deletion_auc', 'insertion_auc'"):
        table.best("mask_iou")
    with _raises(ValueError, "No method has a deletion_auc score"):
        table.best("deletion_auc")


def test_train_mode_model_gives_the_eval_curve_and_stays_in_train_mode(inputs):
    _, x, _ = inputs
    model = tiny_vit(drop_rate=0.5, proj_drop_rate=0.5, attn_drop_rate=0.5, drop_path_rate=0.5)
    model.train()
    model.blocks[0].eval()  # a mixed state must come back as it was, module by module
    modes = {name: m.training for name, m in model.named_modules()}
    first = deletion(model, x, maps(), steps=8)
    second = deletion(model, x, maps(), steps=8)
    torch.testing.assert_close(first.scores, second.scores, rtol=0, atol=0)
    assert {name: m.training for name, m in model.named_modules()} == modes
    with pytest.raises(ValueError, match="steps must be"):
        deletion(model, x, maps(), steps=0)
    assert {name: m.training for name, m in model.named_modules()} == modes
    expected = deletion(model.eval(), x, maps(), steps=8)
    torch.testing.assert_close(first.scores, expected.scores)


def test_data_parallel_models_are_unwrapped(inputs):
    model, x, masks = inputs
    wrapped = nn.DataParallel(model)
    for metric in (deletion, insertion):
        torch.testing.assert_close(
            metric(wrapped, x, maps(), steps=4).scores, metric(model, x, maps(), steps=4).scores
        )
    assert torch.equal(random_saliency(wrapped, x).maps, random_saliency(model, x).maps)
    table = compare_saliency(wrapped, x, ["rollout", "random"], masks=masks, steps=4)
    expected = compare_saliency(model, x, ["rollout", "random"], masks=masks, steps=4)
    np.testing.assert_allclose(table.mean.numpy(), expected.mean.numpy(), rtol=1e-5)
    assert vk.random_saliency is random_saliency


def test_compare_leaves_constant_maps_out_of_the_means():
    """A method whose map is constant for one image is scored on the others; that image's
    scores are NaN and the means are over the scored images."""
    torch.manual_seed(0)
    model = vk.create_model("test_vit", num_classes=5, img_size=32).eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    masks = torch.zeros(3, 32, 32, dtype=torch.bool)
    masks[:, 8:20, 8:20] = True

    def partly_flat(hm, images, targets):
        maps = torch.rand(len(images), 4, 4, generator=torch.Generator().manual_seed(1))
        maps[1] = 0.0
        return SaliencyResult(maps, "partly_flat", tuple(images.shape[-2:]), targets=targets)

    with pytest.warns(UserWarning, match=r"samples \[1\] have constant maps"):
        table = vk.compare_saliency(model, x, [("flat", partly_flat)], masks=masks, steps=4)
    scores = table.per_image[0]  # (metrics, B)
    assert scores[:, 1].isnan().all() and not scores[:, [0, 2]].isnan().any()
    torch.testing.assert_close(table.mean[0], scores[:, [0, 2]].mean(-1))


def test_energy_in_mask_scores_constant_maps_and_ranking_scores_refuse_them():
    masks = torch.zeros(2, 32, 32, dtype=torch.bool)
    masks[:, :8, :16] = True  # an eighth of the image
    flat = torch.ones(2, 4, 4)
    torch.testing.assert_close(energy_in_mask(flat, masks), torch.full((2,), 0.125))
    torch.testing.assert_close(energy_in_mask(flat * 0, masks), torch.zeros(2))
    for score in (pointing_game, top_iou):
        with pytest.raises(ValueError, match="are constant"):
            score(flat, masks)
