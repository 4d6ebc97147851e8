"""vk.datasets.load_images: the user's own images for a model in one call, from a file, a
folder, a list, a PIL image or an array, at the model's real input size."""

import struct
import zlib

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


def _asymmetric(height: int = 24, width: int = 40) -> np.ndarray:
    """(H, W, 3) uint8 whose rows, columns and channels all differ: a rotation shows."""
    rows, cols = np.mgrid[0:height, 0:width]
    return np.stack([rows * 10, cols * 6, (rows * 3 + cols * 5) % 256], -1).astype(np.uint8)


def _png48(pixels: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG of big-endian (H, W, 3) ``pixels``, by the PNG
    specification (IHDR bit depth 16, colour type 2; filter 0 on every row)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + row.tobytes() for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))  # fmt: skip


def test_photos_load_as_a_viewer_shows_them(tmp_path):
    """Each format against a reference decode: EXIF orientation 6 (rotate 90 degrees clockwise
    to view) applied, a 16-bit grey ramp and 48-bit RGB scaled (not clipped at 255), CMYK by
    its standard formula, a palette with transparency by its palette, grey with alpha as grey."""
    from vizkit.datasets.image_folder import read_image

    pixels = _asymmetric()
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the camera was turned
    Image.fromarray(pixels).save(tmp_path / "phone.jpg", exif=exif, quality=95)
    with Image.open(tmp_path / "phone.jpg") as stored:
        raw = np.asarray(stored.convert("RGB"))
    np.testing.assert_array_equal(np.asarray(read_image(tmp_path / "phone.jpg")),
                                  np.rot90(raw, k=-1))  # fmt: skip

    ramp = np.linspace(0, 65535, 24 * 40).reshape(24, 40).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "ramp16.png")
    grey = np.round(ramp / 65535 * 255).astype(np.uint8)
    loaded = np.asarray(read_image(tmp_path / "ramp16.png"))
    np.testing.assert_array_equal(loaded, np.repeat(grey[..., None], 3, -1))
    assert len(np.unique(loaded)) > 200  # not 255 everywhere

    rgb48 = np.stack([ramp, ramp[::-1], ramp.T.reshape(24, 40)], -1).astype(">u2")
    (tmp_path / "rgb48.png").write_bytes(_png48(rgb48))  # Pillow cannot write 16-bit RGB
    expected = np.round(rgb48 / 65535 * 255)
    assert np.abs(np.asarray(read_image(tmp_path / "rgb48.png")) - expected).max() <= 1

    cmyk = np.stack([pixels[..., 0], pixels[..., 1], pixels[..., 2], pixels[..., 0] // 2], -1)
    Image.fromarray(cmyk, "CMYK").save(tmp_path / "print.tif")
    expected = (255 - cmyk[..., :3].astype(float)) * (255 - cmyk[..., 3:].astype(float)) / 255
    assert np.abs(np.asarray(read_image(tmp_path / "print.tif")) - expected).max() <= 1

    palette = np.arange(256 * 3, dtype=np.uint8).reshape(256, 3)
    indices = (pixels[..., 0] // 4).astype(np.uint8)
    image = Image.fromarray(indices, "P")
    image.putpalette(palette.flatten().tolist())
    image.info["transparency"] = 0
    image.save(tmp_path / "palette.png", transparency=0)
    np.testing.assert_array_equal(np.asarray(read_image(tmp_path / "palette.png")),
                                  palette[indices])  # fmt: skip

    Image.fromarray(np.stack([pixels[..., 1], pixels[..., 0]], -1), "LA").save(tmp_path / "la.png")
    np.testing.assert_array_equal(np.asarray(read_image(tmp_path / "la.png")),
                                  np.repeat(pixels[..., 1:2], 3, -1))  # fmt: skip


def test_images_without_a_known_range_and_broken_files_are_named(tmp_path, wide_vit):
    with pytest.raises(ValueError, match="floating-point image"):
        vk.datasets.load_images(Image.fromarray(np.zeros((8, 8), np.float32), "F"), wide_vit)
    old_pillow = Image.fromarray(np.arange(64, dtype=np.int32).reshape(8, 8) * 1024, "I")
    old_pillow.format = "PNG"  # a 16-bit grey PNG as Pillow before 10.3 opens it
    from vizkit.datasets.image_folder import as_viewed_rgb

    assert np.asarray(as_viewed_rgb(old_pillow))[7, 7, 0] == round(63 * 1024 / 65535 * 255)
    dark = Image.fromarray(np.arange(64, dtype=np.int32).reshape(8, 8) * 4, "I")  # 0..252
    with pytest.raises(ValueError, match=r"32-bit integer image \(values 0\.\.252\) has no known"):
        vk.datasets.load_images(dark, wide_vit)
    Image.fromarray(_asymmetric()).save(tmp_path / "ok.png")
    Image.fromarray(_asymmetric()).save(tmp_path / "whole.jpg")
    (tmp_path / "truncated.jpg").write_bytes((tmp_path / "whole.jpg").read_bytes()[:300])
    with pytest.raises(OSError, match="truncated.jpg"):
        vk.datasets.load_images([tmp_path / "ok.png", tmp_path / "truncated.jpg"], wide_vit)
