"""Zoo: recipe -> checkpoint + card -> load round trip; sha256 and pickle refusal."""

import json
import math
import statistics

import pytest
import torch

from vizkit import zoo
from vizkit.datasets import Digits
from vizkit.train.recipes import load_recipe, run_recipe

TINY = {
    "name": "tiny_digits",
    "architecture": "vit_tiny_patch16_224",
    "kwargs": {
        "img_size": 32,
        "patch_size": 8,
        "embed_dim": 32,
        "depth": 1,
        "num_heads": 2,
        "num_classes": 10,
    },
    "data": "digits",
    "train": {
        "epochs": 1,
        "batch_size": 64,
        "lr": 0.003,
        "warmup_epochs": 0.5,
        "seed": 0,
        "flip": False,
    },
}


@pytest.fixture(scope="module")
def trained_zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo")
    recipe = tmp_path_factory.mktemp("recipes") / "tiny_digits_recipe.json"
    recipe.write_text(json.dumps(TINY))
    card = run_recipe(recipe, out_dir=folder, progress=False)
    return folder, card


@pytest.fixture
def zoo_dir(trained_zoo, monkeypatch):
    monkeypatch.setenv("VIZKIT_MODELS", str(trained_zoo[0]))
    return trained_zoo[0]


def test_card_records_the_run(trained_zoo, zoo_dir):
    _, card = trained_zoo
    assert card["architecture"] == "vit_tiny_patch16_224" and card["data"]["name"] == "digits"
    assert len(card["history"]) == 1 and "attention_entropy" in card["history"][0]
    assert card["test_accuracy"] == card["history"][-1]["test_accuracy"]
    assert card["parameters"] == sum(p.numel() for p in zoo.load("tiny_digits")[0].parameters())
    assert card["sha256"] == zoo.sha256(zoo.path("tiny_digits"))


def test_card_names_the_machine_it_trained_on(trained_zoo):
    _, card = trained_zoo
    machine, threads, versions = card["trained_on"].split(", ", 2)
    assert threads == f"{torch.get_num_threads()} threads" and machine
    assert versions.startswith(f"torch {torch.__version__}, timm ")


def test_round_trip_gives_the_same_logits(zoo_dir):
    assert zoo.list_models() == ["tiny_digits"]
    model, card = zoo.load("tiny_digits")
    images = Digits("test").images[:8]
    again, _ = zoo.load("tiny_digits")
    assert torch.equal(model(images), again(images))
    accuracy = (model(Digits("test").images).argmax(-1) == Digits("test").labels).float().mean()
    assert abs(accuracy.item() - card["test_accuracy"]) < 1e-6
    assert tuple(model.pretrained_cfg["input_size"]) == (3, 32, 32)
    assert tuple(model.pretrained_cfg["mean"]) == Digits.mean


def test_tampered_checkpoint_fails_sha256(zoo_dir, tmp_path, monkeypatch):
    for suffix in (".json", ".safetensors"):
        (tmp_path / f"tiny_digits{suffix}").write_bytes(
            (zoo_dir / f"tiny_digits{suffix}").read_bytes()
        )
    data = bytearray((tmp_path / "tiny_digits.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "tiny_digits.safetensors").write_bytes(bytes(data))
    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    with pytest.raises(ValueError, match="does not match the sha256"):
        zoo.load("tiny_digits")


def test_pickles_are_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled"

    class Bomb:
        def __reduce__(self):
            return (marker.write_text, ("boom",))

    pickle_file = tmp_path / "weights.pt"
    torch.save({"x": Bomb()}, pickle_file)
    with pytest.raises(ValueError, match="never unpickles"):
        zoo.load("vit_tiny_patch16_224", checkpoint=pickle_file)
    disguised = tmp_path / "weights.safetensors"
    disguised.write_bytes(pickle_file.read_bytes())
    with pytest.raises(ValueError, match="not a readable safetensors"):  # data, never unpickled
        zoo.load("vit_tiny_patch16_224", checkpoint=disguised)
    assert not marker.exists()


def test_unknown_names_suggest_the_closest_zoo_models(zoo_dir):
    with pytest.raises(KeyError, match=r"Did you mean: tiny_digits\?"):
        zoo.load("tiny_digit")
    with pytest.raises(KeyError, match=r"Did you mean: tiny_digits\?"):
        zoo.card("tiny_digit")
    listed = r"nope_model.\. vk\.zoo\.list_models\(\) lists the 1 zoo model\."
    with pytest.raises(KeyError, match=listed):
        zoo.card("nope_model")


def test_own_checkpoint_through_the_same_function(zoo_dir):
    model, card = zoo.load(
        "vit_tiny_patch16_224", checkpoint=zoo.path("tiny_digits"), **TINY["kwargs"]
    )
    reference, _ = zoo.load("tiny_digits")
    images = Digits("test").images[:4]
    assert torch.equal(model(images), reference(images))
    assert card["weights"].endswith("tiny_digits.safetensors")


def test_bad_recipes(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TINY, "data": "imagenet"}))
    with pytest.raises(ValueError, match="data must be one of"):
        load_recipe(bad)
    bad.write_text(json.dumps({**TINY, "train": {"epochz": 3}}))
    with pytest.raises(ValueError, match=r"unknown train \['epochz'\]"):
        load_recipe(bad)
    with pytest.raises(FileNotFoundError, match="vit_tiny_shapes"):
        load_recipe("no_such_recipe")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_shortened_shipped_recipe_reproduces(tmp_path):
    runs = [
        run_recipe("vit_tiny_digits", out_dir=tmp_path / str(i), epochs=1, progress=False)
        for i in range(2)
    ]
    assert abs(runs[0]["test_accuracy"] - runs[1]["test_accuracy"]) <= 0.01
    assert runs[0]["sha256"] == runs[1]["sha256"]  # same seed, same threads: same weights


def test_accuracy_over_seeds(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    for seed, accuracy in ((0, 0.5), (1, 0.7), (2, 0.9)):
        name = f"sweep_a_s{seed}"
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"test_accuracy": accuracy, "recipe": {"seed": seed}})
        )
        (tmp_path / f"{name}.safetensors").write_bytes(b"")
    (tmp_path / "sweep_ab_s0.json").write_text("{}")  # another prefix, no checkpoint
    summary = zoo.accuracy_over_seeds("sweep_a")
    assert summary["seeds"] == [0, 1, 2] and summary["accuracies"] == [0.5, 0.7, 0.9]
    assert summary["mean"] == pytest.approx(0.7) and summary["std"] == pytest.approx(0.2)
    single = zoo.accuracy_over_seeds("sweep_a", seeds=[1])
    assert single["accuracies"] == [0.7] and math.isnan(single["std"])
    with pytest.raises(KeyError, match="No zoo models named nothing_s"):
        zoo.accuracy_over_seeds("nothing")


def test_seed_contrast_is_the_difference_of_means_against_twice_its_standard_error(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    runs = {"a": (0.80, 0.82, 0.84), "b": (0.70, 0.71, 0.75), "c": (0.83, 0.81, 0.85)}
    for prefix, accuracies in runs.items():
        for seed, accuracy in enumerate(accuracies):
            (tmp_path / f"{prefix}_s{seed}.json").write_text(
                json.dumps({"test_accuracy": accuracy, "recipe": {"seed": seed, "epochs": 6}})
            )
            (tmp_path / f"{prefix}_s{seed}.safetensors").write_bytes(b"")
    a, b = (100 * statistics.mean(runs[k]) for k in "ab")
    se = math.sqrt(sum(statistics.variance([100 * v for v in runs[k]]) / 3 for k in "ab"))
    held = zoo.seed_contrast("a", "b")
    assert held["value"] == pytest.approx(a - b) and held["two_se"] == pytest.approx(2 * se)
    assert held["verdict"] == "held" and zoo.seed_contrast("b", "a")["verdict"] == "not held"
    assert held["seeds"] == ([0, 1, 2], [0, 1, 2])
    assert zoo.seed_contrast("a", "c")["verdict"] == "inconclusive"
    one_seed = zoo.seed_contrast("a", "b", seeds=[0])
    assert math.isnan(one_seed["two_se"]) and one_seed["verdict"] == "inconclusive"
    (trend,) = zoo.contrast_over_budgets("a", "b", [""])
    assert trend == {"budget": "6 epochs", **held}


def test_shared_seeds_read_only_the_seeds_both_have(tmp_path, monkeypatch):
    """As the ledger reads a pair: a with seeds 0-3 against b with 1-2 compares seeds 1-2."""
    monkeypatch.setenv("VIZKIT_MODELS", str(tmp_path))
    runs = {"a": {0: 0.5, 1: 0.80, 2: 0.84, 3: 0.99}, "b": {1: 0.70, 2: 0.75}, "c": {7: 0.9}}
    for prefix, accuracies in runs.items():
        for seed, accuracy in accuracies.items():
            (tmp_path / f"{prefix}_s{seed}.json").write_text(
                json.dumps({"test_accuracy": accuracy, "recipe": {"seed": seed, "epochs": 6}})
            )
            (tmp_path / f"{prefix}_s{seed}.safetensors").write_bytes(b"")
    shared = zoo.seed_contrast("a", "b", seeds="shared")
    assert shared["seeds"] == ([1, 2], [1, 2]) and shared["value"] == pytest.approx(9.5)
    assert zoo.seed_contrast("a", "b")["seeds"] == ([0, 1, 2, 3], [1, 2])
    (trend,) = zoo.contrast_over_budgets("a", "b", [""], seeds="shared")
    assert trend == {"budget": "6 epochs", **shared}
    twice = zoo.contrast_over_budgets("a", "b", ["", ""], seeds=(s for s in (1, 2)))
    assert [t["seeds"] for t in twice] == [([1, 2], [1, 2])] * 2  # a generator serves both
    with pytest.raises(KeyError, match=r"a \(seeds \[0, 1, 2, 3\]\) and c \(seeds \[7\]\)"):
        zoo.seed_contrast("a", "c", seeds="shared")
    with pytest.raises(ValueError, match="seeds must be None, 'shared' or seed numbers"):
        zoo.seed_contrast("a", "b", seeds="common")
