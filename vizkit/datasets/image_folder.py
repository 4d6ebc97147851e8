"""A user's own images, prepared with a model's timm data configuration."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from timm.data import create_transform
from torch import Tensor, nn
from torch.utils.data import Dataset

from .model_input import model_data_config

__all__ = ["UNREADABLE", "ImageFolder", "as_viewed_rgb", "read_image", "readable_images"]

# what PIL raises for a file that is no image, a truncated one, or a decompression bomb
UNREADABLE = (OSError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning)


def read_image(file: Path) -> Image.Image:
    """The whole image in ``file`` as RGB as a viewer shows it (`as_viewed_rgb`), decoded (a
    truncated file raises OSError; an image above PIL's pixel limit, a decompression bomb,
    raises too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(file) as image:
            return as_viewed_rgb(image)


def as_viewed_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB the way an image viewer shows it: its EXIF orientation applied
    (a phone's portrait photo upright), 16-bit greys scaled to 8 bits (not clipped at 255),
    palette, CMYK, grey and alpha modes converted (the alpha channel dropped, as timm's and
    torchvision's loaders drop it). Floating-point and 32-bit integer images, whose range is
    unknown, are refused."""
    stored_as = image.format  # the copy exif_transpose makes has none
    image = ImageOps.exif_transpose(image) or image
    if image.mode == "I" and stored_as != "PNG":  # a PNG's "I" is 16-bit grey (Pillow < 10.3)
        values = np.asarray(image)
        raise ValueError(
            f"A 32-bit integer image (values {values.min()}..{values.max()}) has no known "
            "range; scale it to 0..255 and pass it as a uint8 array."
        )
    if image.mode.startswith("I;16") or image.mode == "I":
        values = np.asarray(image, dtype=np.float64)
        image = Image.fromarray(np.round(values / 65535 * 255).astype(np.uint8), "L")
    elif image.mode == "F":
        raise ValueError(
            "A floating-point image (PIL mode F) has no known range; scale it to 0..255 and "
            "pass it as a uint8 array, or to 0..1 as a float tensor."
        )
    elif image.mode in ("P", "PA"):  # a palette with transparency: through RGBA, as PIL advises
        image = image.convert("RGBA")
    return image.convert("RGB")


def readable_images(path: str | Path, limit: int | None = None) -> list[Path]:
    """The readable image files directly in folder ``path``, sorted by name (the first
    ``limit``); files that are not images, truncated files and decompression bombs are skipped
    with one warning naming each and why.

    Raises:
        FileNotFoundError: no such folder. ValueError: no readable image in it.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"No folder at {folder}.")
    files: list[Path] = []
    skipped: list[str] = []
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        if len(files) == limit:
            break
        try:
            read_image(file)
            files.append(file)
        except UNREADABLE as error:
            why = "not an image" if isinstance(error, UnidentifiedImageError) else error
            skipped.append(f"{file.name} ({why})")
    if not files:
        detail = f"; skipped {'; '.join(skipped)}" if skipped else ""
        raise ValueError(f"{folder} holds no readable image (png, jpg, ...){detail}.")
    if skipped:
        warnings.warn(f"skipped unreadable file(s): {'; '.join(skipped)}", stacklevel=3)
    return files


class ImageFolder(Dataset):
    """The readable images directly in ``path`` (`readable_images`: sorted by name, the first
    ``limit``, unreadable files skipped with a warning), resized, cropped and normalized as
    ``model``'s data config prescribes (timm's eval transform). Items are ``(image (3, H, W)
    float32, file name)``; `load_images` gives a whole folder as one batch.

    Raises:
        ValueError: the folder holds no readable image (the skipped files are named).
        FileNotFoundError: no such folder.
    """

    def __init__(self, path: str | Path, model: nn.Module, limit: int | None = None):
        self.transform = create_transform(**model_data_config(model))
        self.files = readable_images(path, limit)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Tensor, str]:
        return self.transform(read_image(self.files[i])), self.files[i].name
