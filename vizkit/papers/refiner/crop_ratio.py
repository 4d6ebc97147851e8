"""Receptive Field Calibration (Refiner, Zhou et al. 2021, § 4.4, Table 5): evaluate at a test-time
crop ratio rho. timm's eval transform resizes the short side to floor(S / rho) and centre-crops S;
for rho > 1 the image is smaller than S and the crop pads it with pixel value 0 (black, i.e.
-mean/std after normalization), so nothing is cut off."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ...hooks import HookedModel
from ...hooks.contract import analysis_contract, as_hooked
from ...hooks.inputs import check_count, check_images

__all__ = ["crop_ratio_accuracy", "crop_ratio_view"]


def crop_ratio_view(
    images: Tensor, ratio: float, mean: Sequence[float], std: Sequence[float]
) -> Tensor:
    """The eval view of normalized square images (B, C, S, S) at crop ratio ``ratio``: resize to
    floor(S / ratio) (bilinear, antialiased), then centre-crop, or centre-pad with black, to S.
    ratio 1 returns the images unchanged. Returns (B, C, S, S), normalized."""
    if ratio <= 0:
        raise ValueError(f"ratio must be positive (1 = no change, > 1 pads); got {ratio}.")
    size = images.shape[-1]
    if images.ndim != 4 or images.shape[-2] != size:
        raise ValueError(f"Expected square images (B, C, S, S); got {tuple(images.shape)}.")
    side = int(size / ratio)
    if side == size:
        return images
    mean_t = torch.tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    pixels = images * std_t + mean_t
    resized = F.interpolate(pixels, size=(side, side), mode="bilinear", antialias=True)
    if side > size:  # torchvision's CenterCrop: offset round((side - size) / 2)
        top = int(round((side - size) / 2.0))
        view = resized[..., top : top + size, top : top + size]
    else:  # CenterCrop of a smaller image: pad with 0, the extra pixel right and bottom
        pad = (size - side) // 2
        rest = size - side - pad
        view = F.pad(resized, (pad, rest, pad, rest), value=0.0)
    return (view - mean_t) / std_t


@analysis_contract
@torch.no_grad()
def crop_ratio_accuracy(
    model: nn.Module | HookedModel,
    data: Dataset,
    ratios: Sequence[float],
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    batch_size: int = 500,
    progress: bool = True,
) -> dict[float, float]:
    """Top-1 accuracy of ``model`` on ``data`` (items (image, label, ...), normalized) at each
    test-time crop ratio. ``mean``/``std`` default to the model's ``pretrained_cfg``."""
    hm = as_hooked(model)
    check_count("batch_size", batch_size)
    cfg = getattr(hm.model, "pretrained_cfg", {}) or {}
    mean, std = mean or cfg.get("mean"), std or cfg.get("std")
    if mean is None or std is None:
        raise ValueError("Pass mean and std: the model has no pretrained_cfg to read them from.")
    correct = dict.fromkeys(ratios, 0)
    count = 0
    for images, labels, *_ in tqdm(DataLoader(data, batch_size=batch_size), disable=not progress):
        images = check_images(hm.model, images)
        labels = labels.to(images.device)
        for ratio in ratios:
            logits = hm.model(crop_ratio_view(images, ratio, mean, std))
            correct[ratio] += (logits.argmax(-1) == labels).sum().item()
        count += len(labels)
    return {ratio: hits / count for ratio, hits in correct.items()}
