"""One batch for a model from a named data source: what the CLI and the report analyse."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .digits import digit_images
from .image_folder import ImageFolder
from .model_input import model_data_config
from .normalize import denormalize, normalize
from .shapes import SAMPLE_SIZE, SHAPE_CLASSES, SHAPES_MEAN, SHAPES_STD, Shapes, load_sample

__all__ = ["DATA_SOURCES", "Batch", "model_batch"]

DATA_SOURCES = ("shapes", "digits")  # or an image folder


@dataclass
class Batch:
    """Images for a model and what is known about them.

    Attributes:
        images: (B, C, H, W) float32 at the model's input size, normalized for it.
        source: one line saying what the images are.
        labels: (B,) classes, where the data has them. masks: (B, H, W) bool object masks.
        classes: class names, where known.
    """

    images: Tensor
    source: str
    labels: Tensor | None = None
    masks: Tensor | None = None
    classes: list[str] | None = None


def model_batch(
    model: nn.Module, data: str | None = None, n: int = 8, card: dict | None = None
) -> Batch:
    """``n`` images of ``data`` for ``model``.

    Args:
        model: a timm model; its ``pretrained_cfg`` gives the input size and normalization.
        data: "shapes" (the committed test sample where it covers ``n`` images at 32 x 32,
            else the test split rendered at the model's size), "digits" (scikit-learn's, resized)
            or an image folder (up to ``n`` readable images); default: the zoo card's data set,
            else digits.
        n: images wanted, at least 1.
        card: the model's zoo card, if it has one (its data set and class names).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (the number of images) must be an int >= 1; got {n!r}.")
    card = card or {}
    data = data or card.get("data", {}).get("name", "digits")
    classes = card.get("classes")
    cfg = model_data_config(model)
    size = tuple(cfg["input_size"][1:])
    if data == "shapes":
        if n <= SAMPLE_SIZE and size == (32, 32):
            images, labels, masks = (t[:n] for t in load_sample())
            source = f"{n} images of the committed Shapes sample"
        elif size[0] == size[1]:
            shapes = Shapes("test", n=n, size=size[0])
            images = torch.stack([shapes[i][0] for i in range(n)])
            labels, masks = shapes.labels, shapes.masks
            source = f"{n} Shapes test images rendered at {size[0]}x{size[1]}"
        else:
            raise ValueError(f"Shapes are square; this model takes {size[0]}x{size[1]} images.")
        images = _renormalized(images, (SHAPES_MEAN, SHAPES_STD), (cfg["mean"], cfg["std"]))
        return Batch(images, source, labels, masks, classes or list(SHAPE_CLASSES))
    if data == "digits":
        images, labels = digit_images(n, size, cfg["mean"], cfg["std"])
        return Batch(
            images, f"{n} scikit-learn digits at {size[0]}x{size[1]}", labels, None, classes
        )
    folder = Path(data)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"data {data!r} is neither 'shapes', 'digits' nor an existing image folder."
        )
    found = ImageFolder(folder, model, limit=n)  # skips unreadable files with a warning
    images = torch.stack([image for image, _ in found])
    return Batch(images, f"{len(images)} images from {folder}", classes=classes)


def _renormalized(images: Tensor, source: tuple, target: tuple) -> Tensor:
    """(B, 3, H, W) images normalized with ``source`` (mean, std), normalized with ``target``
    instead (the model's config)."""
    if tuple(map(tuple, source)) == tuple(map(tuple, target)):
        return images
    return normalize(denormalize(images, *source), *target)
