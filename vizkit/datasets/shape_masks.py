"""Shape masks: the Shapes images with a class per pixel, a segmentation task.

Each pixel's label is 0 (background: the textured ground and the distractors) or 1 + the class
of the Shapes object covering it (`MASK_CLASSES`), read from the generator's own object mask
(`render_shapes` draws the object last, so its mask is exactly the pixels it covers): the labels
are exact, not annotated. The same arguments give the same bytes on every machine.

The planted question (`vizkit.metrics.mask_shares`): a map explaining one image's shape class,
summed over the whole image, should lie on that shape's pixels, the only ones of that class.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .normalize import normalize
from .shapes import SHAPE_CLASSES, SHAPES_MEAN, SHAPES_STD, load_sample, render_shapes

__all__ = ["MASK_CLASSES", "ShapeMasks", "pixel_labels", "sample_masks"]

MASK_CLASSES = ("background", *SHAPE_CLASSES)
MASK_SPLIT_SIZES = {"train": 8192, "test": 512}


def pixel_labels(labels: Tensor, masks: Tensor) -> Tensor:
    """(n, H, W) int64 per-pixel labels: 1 + ``labels`` (n,) (a Shapes class) on the object's
    pixels ``masks`` (n, H, W) bool, 0 (background) elsewhere."""
    labels, masks = torch.as_tensor(labels), torch.as_tensor(masks)
    if masks.ndim != 3 or labels.shape != masks.shape[:1]:
        raise ValueError(
            f"pixel_labels takes labels (n,) and masks (n, H, W) of the same n; got labels "
            f"{tuple(labels.shape)}, masks {tuple(masks.shape)}."
        )
    if labels.numel() and not bool(((labels >= 0) & (labels < len(SHAPE_CLASSES))).all()):
        raise ValueError(
            f"labels must be Shapes classes in 0..{len(SHAPE_CLASSES) - 1}; got "
            f"{labels.unique()[:5].tolist()}."
        )
    return torch.where(masks.bool(), 1 + labels.long()[:, None, None], 0)


class ShapeMasks(Dataset):
    """Shapes images with per-pixel labels (`MASK_CLASSES`: background and the 10 shapes).

    Args:
        split: "train" (8,192 images) or "test" (512); the Shapes generator's streams.
        n: number of images (default: the split's size).

    Items are ``(image (3, 32, 32) float32 normalized with SHAPES_MEAN/STD, pixel labels
    (32, 32) int64, object mask (32, 32) bool)``; ``objects`` (n,) is each image's object's
    pixel class (1 + its Shapes class).
    """

    classes = MASK_CLASSES
    mean, std = SHAPES_MEAN, SHAPES_STD

    def __init__(self, split: str = "train", n: int | None = None, seed: int = 0) -> None:
        if split not in MASK_SPLIT_SIZES:
            raise ValueError(f"split must be one of {list(MASK_SPLIT_SIZES)}; got {split!r}.")
        n = MASK_SPLIT_SIZES[split] if n is None else n
        if n < 1:
            raise ValueError(f"n must be at least 1; got {n}.")
        images, labels, masks = render_shapes(n, seed=seed, split=split)
        self.images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
        self.masks = torch.from_numpy(masks)
        self.objects = 1 + torch.from_numpy(labels)  # (n,)
        self.labels = pixel_labels(torch.from_numpy(labels), self.masks)  # (n, H, W)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, Tensor]:
        image = normalize(self.images[i].float() / 255, self.mean, self.std)
        return image, self.labels[i], self.masks[i]


def sample_masks() -> tuple[Tensor, Tensor, Tensor]:
    """The committed Shapes sample (`load_sample`) as a segmentation set: images (64, 3, 32, 32)
    normalized, pixel labels (64, 32, 32) int64, object masks (64, 32, 32) bool."""
    images, labels, masks = load_sample()
    return images, pixel_labels(labels, masks), masks
