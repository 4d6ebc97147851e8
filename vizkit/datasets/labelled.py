"""Batches ``(images, labels or None, masks or None)`` of the data sets the data-set-wide
views take (`vk.evaluate`, `vk.sae.spliced_score`): a Dataset, a DataLoader, a tuple of tensors,
or "shapes" (the shipped Shapes sample); and their labels, checked as class indices."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor
from torch.utils.data import (
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    default_collate,
)

__all__ = ["checked_labels", "labelled_batches", "labels_in_memory"]


def labelled_batches(
    data: object, batch_size: int, caller: str, resumable: bool = False
) -> tuple[Iterable, int | None]:
    """Batches ``(images, labels or None, masks or None)`` of ``data`` (a Dataset, a
    DataLoader, a tuple of tensors, or "shapes": the shipped Shapes sample), in a fixed order
    (a shuffling loader is refused when the run is ``resumable``: another order on resume),
    and the number of images when known."""
    if isinstance(data, str):
        if data != "shapes":
            raise ValueError(f"data must be 'shapes', a Dataset or a DataLoader; got {data!r}.")
        from .shapes import load_sample

        data = TensorDataset(*load_sample())
    if isinstance(data, tuple):
        data = TensorDataset(*data)
    if isinstance(data, Dataset):
        data = DataLoader(data, batch_size=batch_size, shuffle=False)
    if not isinstance(data, DataLoader):
        raise TypeError(
            f"data must be a Dataset, a DataLoader, a tuple of tensors or 'shapes'; got "
            f"{type(data).__name__}."
        )
    if resumable and isinstance(getattr(data, "sampler", None), RandomSampler):
        raise ValueError(
            "The DataLoader shuffles, so a resumed run would see other images in each batch; "
            f"{caller} does not depend on the order: pass shuffle=False (or leave out out=)."
        )
    count = len(data.dataset) if hasattr(data.dataset, "__len__") else None

    def split(batch: object) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if isinstance(batch, dict):
            raise TypeError(
                f"The data yields dicts (keys {', '.join(map(str, batch))}); {caller} takes "
                "(images, labels[, masks]) tuples. Wrap the dataset so that each item is one, "
                "e.g. (item['pixel_values'], item['label'])."
            )
        items = list(batch) if isinstance(batch, (list, tuple)) else [batch]
        x = items[0]
        labels = items[1] if len(items) > 1 and isinstance(items[1], Tensor) else None
        masks = items[2] if len(items) > 2 and isinstance(items[2], Tensor) else None
        return x, labels, masks

    return (split(b) for b in data), count


def labels_in_memory(data: object) -> Tensor | None:
    """The data's labels (N,) when they are one tensor in memory and every one of them is
    yielded as it is (a tuple of tensors, a TensorDataset, or a loader over one that reads it
    all in order with the default collation); None otherwise."""
    if isinstance(data, DataLoader):
        whole = (isinstance(data.sampler, SequentialSampler) and not data.drop_last
                 and data.collate_fn is default_collate)  # fmt: skip
        if not whole:
            return None
        data = data.dataset
    tensors = data if isinstance(data, tuple) else getattr(data, "tensors", None)
    if isinstance(data, (tuple, TensorDataset)) and len(tensors) > 1:
        return tensors[1] if isinstance(tensors[1], Tensor) else None
    return None


def checked_labels(labels: Tensor | None, classes: int, start: int) -> Tensor:
    """(B,) ``labels`` as class indices of a model of ``classes`` classes, refused (naming the
    image's place in the data and its value) unless they are whole numbers in range; the
    batch's first image is the ``start``-th of the data."""
    if labels is None:
        raise ValueError(
            "targets='labels', but the data yields no labels (only images): pass "
            "targets='predictions' to explain the model's own predictions, or data of "
            "(images, labels)."
        )
    if labels.ndim == 2 and labels.shape[-1] == classes:
        raise ValueError(
            f"The labels are one-hot or scores over the {classes} classes, shape "
            f"{tuple(labels.shape)}; evaluate takes class indices (B,): pass labels.argmax(1)."
        )
    if labels.ndim != 1:
        raise ValueError(f"labels must be class indices (B,); got shape {tuple(labels.shape)}.")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        fractional = (
            (labels != labels.round()).nonzero()[:, 0] if labels.is_floating_point() else []
        )
        i = int(fractional[0]) if len(fractional) else 0
        raise ValueError(
            f"labels must be integer class indices; got {labels.dtype} (image {start + i}: "
            f"{labels[i].item()}). Pass a LongTensor of classes."
        )
    wrong = ((labels < 0) | (labels >= classes)).nonzero()[:, 0]
    if len(wrong):
        i = int(wrong[0])
        raise ValueError(
            f"Label {int(labels[i])} of image {start + i} is not a class of this model, which "
            f"has {classes} (0..{classes - 1}); {len(wrong)} such label(s) in its batch. Check "
            "the data's labels against the model's classes."
        )
    return labels.long()
