"""scikit-learn's handwritten digits (real data that ships inside the package) as image batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from .normalize import normalize

__all__ = ["DIGITS_MEAN", "DIGITS_STD", "Digits", "digit_images"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DIGITS_MEAN = (0.5, 0.5, 0.5)  # normalization chosen for [0, 1] images, not fitted
DIGITS_STD = (0.25, 0.25, 0.25)
TEST_FRACTION = 0.2


def _upsample(grey: np.ndarray, size: tuple[int, int]) -> Tensor:
    """(n, 8, 8) values 0..16 -> (n, 3, H, W) in [0, 1], bilinear."""
    t = torch.from_numpy(grey).float().div(16.0)[:, None]
    return (
        F.interpolate(t, size=size, mode="bilinear", align_corners=False)
        .clamp(0, 1)
        .expand(-1, 3, -1, -1)
    )


def digit_images(
    n: int,
    image_size: int | tuple[int, int] = 32,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    offset: int = 0,
) -> tuple[Tensor, Tensor]:
    """The first ``n`` digits (from ``offset``) as normalized RGB images for any model.

    The 8x8 grey images (values 0..16) are scaled to [0, 1], resized bilinearly, repeated to
    three channels and normalized with ``mean``/``std`` (a model's ``pretrained_cfg``).

    Returns:
        images (n, 3, H, W) float32 and labels (n,) int64.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    total = len(digits.target)
    if n < 1 or offset < 0 or offset + n > total:
        raise ValueError(
            f"Asked for digits {offset}..{offset + n - 1}; there are {total} (0.."
            f"{total - 1}) and n must be at least 1."
        )
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    images = _upsample(digits.images[offset : offset + n], size)
    labels = torch.from_numpy(digits.target[offset : offset + n]).long()
    return normalize(images, mean, std), labels


class Digits(Dataset):
    """scikit-learn's 1,797 handwritten digits, upsampled to ``size`` x ``size`` RGB.

    The split is fixed: a stratified 80/20 split drawn once with seed 0 (1,437 train, 360 test).
    Items are ``(image (3, H, W) float32 normalized with DIGITS_MEAN/STD, label)``.
    """

    classes = tuple(str(d) for d in range(10))
    mean, std = DIGITS_MEAN, DIGITS_STD

    def __init__(self, split: str = "train", size: int = 32):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test'; got {split!r}.")
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        index = np.arange(len(digits.target))
        train_idx, test_idx = train_test_split(
            index, test_size=TEST_FRACTION, stratify=digits.target, random_state=0
        )
        chosen = np.sort(train_idx if split == "train" else test_idx)
        self.images = normalize(_upsample(digits.images[chosen], (size, size)), self.mean, self.std)
        self.labels = torch.from_numpy(digits.target[chosen]).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.images[i], int(self.labels[i])
