"""Batches ``(images, labels or None, masks or None)`` of the data sets the data-set-wide
views take (`vk.evaluate`, `vk.sae.spliced_score`): a Dataset, a DataLoader, a tuple of tensors,
or "shapes" (the shipped Shapes sample)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor
from torch.utils.data import DataLoader, Dataset, RandomSampler, TensorDataset

__all__ = ["labelled_batches"]


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
