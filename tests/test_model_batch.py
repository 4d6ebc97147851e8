"""`model_batch`: the one way the CLI and the report turn "model + data source" into images."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from vizkit import zoo
from vizkit.datasets import load_sample, model_batch
from vizkit.datasets.model_input import model_data_config


def vit(size=32):
    return timm.create_model("vit_tiny_patch16_224", img_size=size, patch_size=8, depth=1)


def test_shapes_come_from_the_committed_sample_and_beyond_it_are_rendered():
    images, _, masks = load_sample()
    shapes_model, card = zoo.load("vit_tiny_shapes")  # normalized as Shapes are
    small = model_batch(shapes_model, "shapes", n=5, card=card)
    assert torch.equal(small.images, images[:5]) and torch.equal(small.masks, masks[:5])
    other = vit()  # timm's config: mean and std 0.5, renormalized for it
    cfg = model_data_config(other)
    assert cfg["std"] != (0.25, 0.25, 0.25)
    pixels = images[:5] * 0.25 + 0.5
    mean, std = (torch.tensor(cfg[k]).view(3, 1, 1) for k in ("mean", "std"))
    torch.testing.assert_close(model_batch(other, "shapes", n=5).images, (pixels - mean) / std)
    assert "committed Shapes sample" in small.source and small.classes[0] == "circle"
    large = model_batch(vit(), "shapes", n=70)  # more than the sample holds: rendered
    assert large.images.shape == (70, 3, 32, 32) and large.masks.shape == (70, 32, 32)
    assert large.labels.shape == (70,) and "70 Shapes test images rendered" in large.source
    wide = model_batch(vit(48), "shapes", n=3)
    assert wide.images.shape == (3, 3, 48, 48) and "rendered at 48x48" in wide.source


def test_digits_and_the_cards_data_set_are_at_the_models_size():
    digits = model_batch(vit(48), "digits", n=4)
    assert digits.images.shape == (4, 3, 48, 48) and digits.labels.tolist() == [0, 1, 2, 3]
    assert digits.masks is None
    by_card = model_batch(vit(), n=2, card={"data": {"name": "shapes"}, "classes": ["a"] * 5})
    assert by_card.masks is not None and by_card.classes == ["a"] * 5
    assert "digits" in model_batch(vit(), n=2).source  # no card: digits


def test_an_image_folder_is_read_with_the_models_transform(tmp_path):
    for i in range(3):
        Image.fromarray(np.full((40, 50, 3), 60 * i, np.uint8)).save(tmp_path / f"{i}.png")
    batch = model_batch(vit(), str(tmp_path), n=2)
    assert batch.images.shape == (2, 3, 32, 32) and batch.labels is None
    assert f"2 images from {tmp_path}" == batch.source


@pytest.mark.parametrize(
    ("data", "n", "error", "match"),
    [
        ("/no/such/folder", 2, FileNotFoundError, "neither 'shapes', 'digits' nor an existing"),
        ("shapes", 0, ValueError, "n .* must be an int >= 1; got 0"),
        ("digits", 2.5, ValueError, "got 2.5"),
    ],
)
def test_bad_sources_and_counts_are_refused(data, n, error, match):
    with pytest.raises(error, match=match):
        model_batch(vit(), data, n=n)
