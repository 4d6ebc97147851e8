"""vk.datasets.load_images: the user's own images for a model in one call, from a file, a
folder, a list, a PIL image or an array, at the model's real input size."""

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_image
from timm.data import create_transform

import vizkit as vk
from vizkit.datasets.model_input import model_data_config


@pytest.fixture(scope="module")
def photo():
    return load_sample_image("china.jpg")  # (427, 640, 3) uint8, ships with scikit-learn


@pytest.fixture(scope="module")
def wide_vit():
    return vk.create_model("vit_tiny_patch16_224", img_size=(224, 320), depth=1).eval()


def test_a_photo_matches_timms_eval_transform_at_the_models_real_size(photo, wide_vit, tmp_path):
    Image.fromarray(photo).save(tmp_path / "china.png")
    x, shown, names = vk.datasets.load_images(tmp_path / "china.png", wide_vit)
    cfg = model_data_config(wide_vit)
    assert cfg["input_size"] == (3, 224, 320)  # resolve_data_config alone says 224 x 224
    expected = create_transform(**cfg)(Image.fromarray(photo))
    torch.testing.assert_close(x[0], expected)
    assert (
        x.shape == (1, 3, 224, 320) and shown.shape == (1, 224, 320, 3) and names == ["china.png"]
    )
    mean, std = np.array(cfg["mean"]), np.array(cfg["std"])
    undone = (x[0].permute(1, 2, 0).numpy() * std + mean) * 255
    assert shown.dtype == np.uint8 and np.abs(shown[0] - undone).max() <= 0.5 + 1e-3
    assert vk.attention(wide_vit, x).layout.grid == (14, 20)


def test_every_source_kind_gives_the_same_pixels(photo, wide_vit, tmp_path):
    Image.fromarray(photo).save(tmp_path / "b.png")
    Image.fromarray(photo[:, ::-1].copy()).save(tmp_path / "a.png")
    (tmp_path / "notes.txt").write_text("not an image")
    reference = vk.datasets.load_images(photo, wide_vit).x[0]
    chw = torch.from_numpy(photo.copy()).permute(2, 0, 1)
    sources = {
        "PIL": Image.fromarray(photo),
        "array batch": photo[None],
        "uint8 tensor (3, H, W)": chw,
        "floats in [0, 1]": chw.float() / 255,
        "str path": str(tmp_path / "b.png"),
    }
    for kind, source in sources.items():
        torch.testing.assert_close(
            vk.datasets.load_images(source, wide_vit).x[0], reference, msg=kind
        )
    with pytest.warns(UserWarning, match=r"notes\.txt \(not an image\)"):
        folder = vk.datasets.load_images(tmp_path, wide_vit)
    assert folder.names == ["a.png", "b.png"]
    torch.testing.assert_close(folder.x[1], reference)
    mixed = vk.datasets.load_images([photo, tmp_path / "b.png", photo[None].repeat(2, 0)], wide_vit)
    assert mixed.names == ["image 0", "b.png", "image 2", "image 3"] and len(mixed.x) == 4
    grey = vk.datasets.load_images(photo[..., 0], wide_vit).x
    assert grey.shape == (1, 3, 224, 320)


@pytest.mark.parametrize(
    "source, error, match",
    [
        ("no/such/file.jpg", FileNotFoundError, "No image file or folder"),
        ([], ValueError, "empty list"),
        (np.zeros((4, 5, 6, 7, 3), np.uint8), ValueError, r"\(H, W, 3\)"),
        (np.zeros((40, 50, 5), np.uint8), ValueError, "colour axis"),
        (np.full((40, 50, 3), 2.0), ValueError, r"\[0, 1\]"),
        (np.zeros((40, 50, 3), np.int32), ValueError, "uint8"),
        (3, TypeError, "file or folder path"),
    ],
)
def test_bad_sources_say_what_is_accepted(source, error, match, wide_vit):
    with pytest.raises(error, match=match):
        vk.datasets.load_images(source, wide_vit)


def test_an_empty_folder_is_refused(tmp_path, wide_vit):
    with pytest.raises(ValueError, match="holds no readable image"):
        vk.datasets.load_images(tmp_path, wide_vit)
