"""A user's own images, prepared with a model's timm data configuration."""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from timm.data import create_transform
from torch import Tensor, nn
from torch.utils.data import Dataset

from .model_input import model_data_config

__all__ = ["ImageFolder", "read_image", "readable_images"]

# what PIL raises for a file that is no image, a truncated one, or a decompression bomb
_UNREADABLE = (OSError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning)


def read_image(file: Path) -> Image.Image:
    """The whole image in ``file`` as RGB, decoded (a truncated file raises OSError; an image
    above PIL's pixel limit, a decompression bomb, raises too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(file) as image:
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
        except _UNREADABLE as error:
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
