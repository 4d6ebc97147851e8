"""A user's own images, prepared with a model's timm data configuration."""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from timm.data import create_transform, resolve_data_config
from torch import Tensor, nn
from torch.utils.data import Dataset

__all__ = ["ImageFolder"]


class ImageFolder(Dataset):
    """Every readable image directly in ``path`` (sorted by name), resized, cropped and
    normalized as ``model``'s pretrained config prescribes (timm's eval transform).

    Files that are not images or cannot be decoded are skipped with one warning naming them.
    Items are ``(image (3, H, W) float32, file name)``.

    Raises:
        ValueError: the folder holds no readable image. FileNotFoundError: no such folder.
    """

    def __init__(self, path: str | Path, model: nn.Module):
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"No folder at {folder}.")
        self.transform = create_transform(**resolve_data_config({}, model=model))
        self.files: list[Path] = []
        skipped: list[str] = []
        for file in sorted(p for p in folder.iterdir() if p.is_file()):
            try:
                with Image.open(file) as image:
                    image.verify()
                self.files.append(file)
            except (UnidentifiedImageError, OSError, SyntaxError):
                skipped.append(file.name)
        if skipped:
            warnings.warn(
                f"Skipped {len(skipped)} file(s) that are not readable images: "
                f"{', '.join(skipped)}",
                stacklevel=2,
            )
        if not self.files:
            raise ValueError(
                f"{folder} holds no readable image (png, jpg, ...); "
                f"{len(skipped)} other file(s) skipped."
            )

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Tensor, str]:
        with Image.open(self.files[i]) as image:
            return self.transform(image.convert("RGB")), self.files[i].name
