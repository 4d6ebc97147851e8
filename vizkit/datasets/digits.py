"""scikit-learn's handwritten digits (real data that ships inside the package) as image batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["digit_images"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def digit_images(
    n: int,
    image_size: int | tuple[int, int] = 32,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    offset: int = 0,
) -> tuple[Tensor, Tensor]:
    """The first ``n`` digits (from ``offset``) as normalized RGB images.

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
    grey = torch.from_numpy(digits.images[offset : offset + n]).float().div(16.0)  # (n, 8, 8)
    rgb = F.interpolate(grey[:, None], size=size, mode="bilinear", align_corners=False)
    rgb = rgb.clamp(0, 1).expand(-1, 3, -1, -1)  # (n, 3, H, W)
    mean_t = torch.tensor(mean, dtype=torch.float32)[:, None, None]
    std_t = torch.tensor(std, dtype=torch.float32)[:, None, None]
    labels = torch.from_numpy(digits.target[offset : offset + n]).long()
    return (rgb - mean_t) / std_t, labels
