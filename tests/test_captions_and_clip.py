"""Shapes captions are what the generator drew (shape, size, tone, tint, position, checked
against the masks and pixels); the word tokenizer's ids suit open_clip's text tower; the
contrastive loss is CLIP's (Radford et al. 2021, Fig. 3) and training lowers it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vizkit as vk
from vizkit import zoo
from vizkit.datasets import SHAPE_CLASSES
from vizkit.datasets.captions import (
    POSITIONS,
    VOCABULARY,
    ShapeCaptions,
    WordTokenizer,
    caption,
    shape_attributes,
)
from vizkit.models.text_image import clip_shapes, shapes_zero_shot
from vizkit.train.contrastive import (
    ContrastiveConfig,
    contrastive_loss,
    train_contrastive,
    zero_shot_accuracy,
)
from vizkit.train.recipes import load_recipe, run_recipe, sample_accuracy


def test_attributes_are_read_from_the_mask_and_pixels():
    images = np.full((2, 30, 30, 3), 200, dtype=np.uint8)
    masks = np.zeros((2, 30, 30), dtype=bool)
    masks[0, 2:8, 22:28] = True  # top right, 6 px: small
    images[0][masks[0]] = (40, 10, 10)  # dark red
    masks[1, 5:25, 5:25] = True  # centre, 20 px of 30: large
    images[1][masks[1]] = (230, 230, 225)  # light grey
    first, second = shape_attributes(images, np.array([5, 0]), masks)
    assert first == {"shape": "star", "size": "small", "tone": "dark", "tint": "red",
                     "position": "top right"}  # fmt: skip
    assert second == {"shape": "circle", "size": "large", "tone": "light", "tint": "grey",
                      "position": "center"}  # fmt: skip


def test_captions_name_the_shape_and_true_attributes():
    data = ShapeCaptions("train", n=200)
    assert len(data) == 200 and data[3][0].shape == (3, 32, 32)
    for text, attributes, label in zip(data.captions, data.attributes, data.labels, strict=True):
        assert SHAPE_CLASSES[int(label)] in text.split()
        named = set(text.split()) & {"small", "large", "dark", "light", "grey", "red", "yellow",
                                      "green", "cyan", "blue", "purple"}  # fmt: skip
        assert named <= set(attributes.values())
        if " at the " in text:
            assert text.endswith(attributes["position"])
    assert len(set(data.captions)) > 100  # attributes are left out at random
    assert caption(data.attributes[0], 7) == caption(data.attributes[0], 7)
    assert ShapeCaptions("train", n=200).captions == data.captions


def test_the_tokenizer_ends_on_its_largest_id():
    tokenizer = WordTokenizer(context_length=11)  # the longest caption: 9 words
    ids = tokenizer(["a star", "a small dark red star at the top left"])
    assert ids.shape == (2, 11) and ids[0, 0] == 1
    assert (ids.argmax(-1) == torch.tensor([3, 10])).all()  # open_clip pools at the argmax
    assert tokenizer.vocab_size == len(VOCABULARY) + 3
    words = {w for row in POSITIONS for p in row for w in p.split()}
    assert words <= set(VOCABULARY) and set(SHAPE_CLASSES) <= set(VOCABULARY)
    with pytest.raises(ValueError, match=r"\['dog'\] are not in this tokenizer's vocabulary"):
        tokenizer("a dog")
    with pytest.raises(ValueError, match="at most 9 fit"):
        tokenizer("a small dark red star at the top left left")


def test_the_loss_is_clips_symmetric_cross_entropy():
    images, texts = torch.randn(5, 8), torch.randn(5, 8)
    scale = torch.tensor(10.0)
    logits = scale * F.normalize(images, dim=-1) @ F.normalize(texts, dim=-1).T
    by_hand = [-(logits[i, i] - logits[i].logsumexp(0)) for i in range(5)]
    by_hand += [-(logits[i, i] - logits[:, i].logsumexp(0)) for i in range(5)]
    torch.testing.assert_close(contrastive_loss(images, texts, scale), torch.stack(by_hand).mean())


def test_training_lowers_the_loss_and_zero_shot_reads_the_nearest_prompt():
    data = ShapeCaptions("train", n=256)
    images = torch.stack([data[i][0] for i in range(len(data))])
    tokenizer = WordTokenizer()
    torch.manual_seed(0)
    model = clip_shapes(tokenizer.vocab_size, tokenizer.context_length, embed_dim=16, width=32,
                        layers=1, heads=2, text_width=32, text_layers=1)  # fmt: skip
    config = ContrastiveConfig(epochs=6, batch_size=64, lr=2e-3, warmup_epochs=0.5)
    history = train_contrastive(model, tokenizer, images, data.captions, config, progress=False)
    assert history[-1]["loss"] < history[0]["loss"] - 0.3
    with torch.no_grad():
        prompts = F.normalize(
            model.encode_text(tokenizer([f"a {c}" for c in SHAPE_CLASSES])), dim=-1
        )
        nearest = (F.normalize(model.encode_image(images), dim=-1) @ prompts.T).argmax(-1)
    expected = float((nearest == data.labels).float().mean())
    assert zero_shot_accuracy(model, tokenizer, images, data.labels, SHAPE_CLASSES,
                              batch_size=100) == pytest.approx(expected)  # fmt: skip


def test_a_contrastive_recipe_writes_a_zoo_model_that_loads_as_open_clip(tmp_path):
    """The recipe trains the text-image model, and its card holds the tokenizer, the prompt and
    the zero-shot accuracy; the zoo loads it as an open_clip CLIP that prepares photos with
    Shapes' statistics, and as a zero-shot classifier it reproduces the card's accuracy."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({
        "name": "clip_tiny", "architecture": "clip_shapes", "data": "shapes",
        "objective": "contrastive",
        "kwargs": {"embed_dim": 16, "width": 32, "layers": 1, "heads": 2, "text_width": 32,
                   "text_layers": 1},
        "train": {"epochs": 1, "batch_size": 64, "images": 256, "threads": 1},
    }))  # fmt: skip
    card = run_recipe(recipe, out_dir=tmp_path, progress=False, readme=False)
    assert card["tokenizer"] == WordTokenizer().to_dict()
    assert card["zero_shot"] == {"template": "a {}"} and card["data"]["train"] == 256
    assert len(card["history"]) == 1 and 0 <= card["test_accuracy"] <= 1
    model, loaded = zoo.load(tmp_path / "clip_tiny.safetensors")
    assert type(model).__name__ == "CLIP" and loaded["sha256"] == card["sha256"]
    preprocessing = vk.datasets.model_preprocessing(model)
    assert preprocessing.mean == (0.5, 0.5, 0.5) and preprocessing.std == (0.25, 0.25, 0.25)
    classifier = shapes_zero_shot(model, loaded)
    assert sample_accuracy(classifier, "shapes") == pytest.approx(card["sample_accuracy"])
    test = ShapeCaptions("test")
    images = torch.stack([test[i][0] for i in range(len(test))])
    with torch.no_grad():
        right = (classifier(images).argmax(-1) == test.labels).float().mean()
    assert float(right) == pytest.approx(card["test_accuracy"])


def test_a_contrastive_recipe_is_checked():
    with pytest.raises(ValueError, match="trains a text-image model of vizkit's"):
        load_recipe_text({"name": "x", "architecture": "vit_tiny_patch16_224", "kwargs": {},
                          "data": "shapes", "objective": "contrastive", "train": {}})  # fmt: skip
    with pytest.raises(ValueError, match="unknown train"):
        load_recipe_text({"name": "x", "architecture": "clip_shapes", "kwargs": {},
                          "data": "shapes", "objective": "contrastive",
                          "train": {"label_smoothing": 0.1}})  # fmt: skip
    with pytest.raises(ValueError, match="objective must be one of"):
        load_recipe_text({"name": "x", "architecture": "clip_shapes", "kwargs": {},
                          "data": "shapes", "objective": "captions", "train": {}})  # fmt: skip


def load_recipe_text(spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "recipe.json"
        file.write_text(json.dumps(spec))
        return load_recipe(file)
