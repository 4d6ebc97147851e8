"""Zoo: recipe -> checkpoint + card -> load round trip; sha256 and pickle refusal."""

import json

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
