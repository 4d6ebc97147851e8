"""Training on per-pixel labels (a segmentation data set, whose items' labels are (H, W) maps):
the loss and the held-out scores, mean IoU and pixel accuracy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from ..targets.dense import dense_logits

__all__ = [
    "check_pixel_labels",
    "is_dense_data",
    "pixel_cross_entropy",
    "pixel_logits",
    "segmentation_scores",
]


def is_dense_data(data: Dataset) -> bool:
    """Whether ``data``'s items are (image, per-pixel labels (H, W), ...)."""
    label = data[0][1]
    return isinstance(label, Tensor) and label.ndim == 2


def pixel_logits(output: object, size: tuple[int, int]) -> Tensor:
    """(B, K, H, W) a segmentation model's logits (its output, or a transformers
    ``SemanticSegmenterOutput``'s ``logits`` (B, K, h, w)) resized to the labels' ``size``
    bilinearly (``align_corners=False``), as transformers' post-processing and its DPT's own
    loss resize them."""
    logits = dense_logits(output)
    if tuple(logits.shape[-2:]) == tuple(size):
        return logits
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)


def pixel_cross_entropy(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over every pixel of ``labels`` (B, H, W) int64 in 0..K-1, of
    ``logits`` (B, K, H, W) at their size (`pixel_logits`)."""
    check_pixel_labels(labels, logits.shape[1])
    return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)


def check_pixel_labels(labels: Tensor, classes: int) -> None:
    """Refuse labels (B, H, W) outside 0..``classes``-1."""
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        raise ValueError(
            f"Pixel labels must be classes in 0..{classes - 1} (the model's {classes} logits "
            f"per pixel); got labels in {low}..{high}. Build the model with num_labels "
            f"{high + 1}, or map the labels to its classes."
        )


@torch.no_grad()
def segmentation_scores(model: nn.Module, data: Dataset, batch_size: int = 500) -> dict:
    """Mean per-pixel cross-entropy ("loss"), pixel accuracy ("accuracy") and mean IoU
    ("miou": per class, |predicted & true| / |predicted | true| over all of ``data``'s pixels,
    averaged over the classes present in the labels or the predictions) of ``model`` on
    ``data`` (items (image, labels (H, W), ...))."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, count, confusion = 0.0, 0, None
    for images, labels, *_ in DataLoader(data, batch_size=batch_size):
        labels = labels.to(device)
        logits = pixel_logits(model(images.to(device)), tuple(labels.shape[-2:]))
        loss_sum += pixel_cross_entropy(logits, labels).item() * labels.numel()
        count += labels.numel()
        k = logits.shape[1]
        pairs = labels.flatten() * k + logits.argmax(1).flatten()
        counts = torch.bincount(pairs, minlength=k * k).reshape(k, k).cpu()
        confusion = counts if confusion is None else confusion + counts
    model.train(was_training)
    hits = confusion.diagonal().double()
    union = confusion.sum(0) + confusion.sum(1) - confusion.diagonal()
    present = union > 0
    return {
        "loss": loss_sum / count,
        "accuracy": (hits.sum() / count).item(),
        "miou": (hits[present] / union[present]).mean().item(),
    }
