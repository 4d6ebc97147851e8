"""The checkpoints in models/ load (sha256 verified) and reach the accuracy their cards record."""

import math
import re
import statistics

import pytest
import torch

from vizkit import zoo
from vizkit.models.text_image import shapes_zero_shot
from vizkit.train.recipes import recipe_names, sample_accuracy

SHIPPED = zoo.list_models()
SHAPES = [n for n in SHIPPED if zoo.card(n)["data"]["name"] == "shapes"]
# How far a model's accuracy on the 64-image sample may fall from its 2,000-image test accuracy,
# in binomial standard deviations. At 3 for each model, one of 140 fell outside by chance
# (sot_svpn_a03_s6: 62.5 % on the sample, 79.95 % on the test set; the fixed sample is a little
# harder than the test set, -0.77 std on average): Bonferroni over the Shapes models holds the
# whole zoo's chance of a false alarm at 1 % (3.97 std for 140 models).
SAMPLE_Z = statistics.NormalDist().inv_cdf(1 - 0.01 / (2 * max(1, len(SHAPES))))
# A zoo model retrains within 15 minutes on 2 CPU cores (issue 3), except the larger budgets the
# claims ledger measures a claim at (issue 37: depth `_d24`, epochs `_e12`): within 30.
LARGER_BUDGET = re.compile(r"_[de]\d+(_s\d+)?$")


def training_limit_minutes(name: str) -> int:
    return 30 if LARGER_BUDGET.search(name) else 15


def test_larger_budgets_are_read_from_the_name():
    assert training_limit_minutes("vit_deep_shapes_d24") == 30
    assert training_limit_minutes("sot_wordt_e12_s2") == 30
    assert training_limit_minutes("sot_wordt_s2") == 15
    assert training_limit_minutes("masks_gmm_k5_s0") == 15


def test_every_recipe_has_a_shipped_model():
    assert SHIPPED, "models/ holds no checkpoints"
    assert set(recipe_names()) <= set(SHIPPED), "a recipe was never trained into models/"


@pytest.mark.parametrize("name", SHIPPED)
def test_recorded_accuracy_is_reproduced(name):
    model, card = zoo.load(name)
    if "zero_shot" in card:  # a text-image model: a classifier by its prompts
        model = shapes_zero_shot(model, card)
    measured = sample_accuracy(model, card["data"]["name"])
    assert measured == pytest.approx(card["sample_accuracy"], abs=1e-6)
    # the 64-image sample agrees with the 2,000-image test accuracy (SAMPLE_Z binomial std)
    p, n = card["test_accuracy"], 64
    if name in SHAPES:
        assert abs(measured - p) <= SAMPLE_Z * math.sqrt(p * (1 - p) / n) + 1 / n


@pytest.mark.parametrize("name", SHIPPED)
def test_cards_are_complete(name):
    card = zoo.card(name)
    for key in [
        "architecture",
        "kwargs",
        "data",
        "recipe",
        "test_accuracy",
        "parameters",
        "training_seconds",
        "sha256",
        "history",
        "pretrained_cfg",
    ]:
        assert key in card, f"{name}: card lacks {key}"
    assert len(card["history"]) == card["recipe"]["epochs"]
    assert zoo.path(name).stat().st_size <= 8e6, f"{name} is over 8 MB"
    limit = training_limit_minutes(name)
    assert card["training_seconds"] <= limit * 60, f"{name} trained longer than {limit} minutes"


TRANSFORMERS = [n for n in SHIPPED if n in ("vit_tiny_shapes", "cait_tiny_shapes")]


def test_the_text_image_model_is_within_ten_points_of_the_supervised_vit():
    """Issue 55's bar: zero-shot from the prompt "a <shape>", on the 2,000 test images."""
    supervised = zoo.card("vit_tiny_shapes")["test_accuracy"]
    assert zoo.card("clip_shapes")["test_accuracy"] >= supervised - 0.10


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_reach_90_percent_on_shapes(name):
    assert zoo.card(name)["test_accuracy"] >= 0.9  # issue 3's bar, within 15 minutes (above)


def test_trained_attention_is_not_uniform():
    model, _ = zoo.load("vit_tiny_shapes")
    import vizkit as vk
    from vizkit.datasets import load_sample

    images, _, _ = load_sample()
    with torch.no_grad():
        _, cache = vk.HookedModel(model).run_with_cache(images, names="blocks.*.attn.hook_pattern")
    entropy = vk.analysis.normalized_entropy(cache.stack("attn.hook_pattern")).mean((1, 2, 3))
    assert entropy.min() < 0.9, "a trained model should attend selectively in some layer"
