"""The probe set the concept methods read: batches of images with their indices in the set, in
a fixed order each time, or only those indices when the units are read from an activation store
(the store's images stand for the images)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torch import Tensor
from torch.utils.data import DataLoader, SequentialSampler

from ..datasets.labelled import labelled_batches
from ..store import ActivationStore

__all__ = ["ProbeSet", "probe_set"]


@dataclass(frozen=True)
class ProbeSet:
    """``batches()``: (images (B, C, H, W) or None, labels (B,) or None, rows: the images'
    indices in the set), in the same order at each call; ``count``: the images (None where the
    data does not say)."""

    batches: Callable[[], Iterator[tuple[Tensor | None, Tensor | None, range]]]
    count: int | None


def probe_set(
    images: object, batch_size: int, caller: str, store: ActivationStore | None = None,
    need_images: bool = False,
) -> ProbeSet:  # fmt: skip
    """The probe set of ``images`` (a tensor (N, C, H, W), a Dataset or a non-shuffling
    DataLoader of images or (image, label, ...) tuples), or of ``store``'s images (``images``
    None, or the store's own images, checked by their hashes, unless ``need_images``)."""
    if isinstance(images, DataLoader) and not isinstance(images.sampler, SequentialSampler):
        raise ValueError(
            "The DataLoader does not read its dataset in order (it shuffles or samples), so its "
            f"images cannot be matched with what {caller} pairs them with; pass shuffle=False."
        )
    if store is not None and not isinstance(store, ActivationStore):
        raise TypeError(f"store must be a vk.ActivationStore; got {type(store).__name__}.")
    if images is None:
        if store is None or need_images:
            needed = "its images" if store is None else "the images (the store holds no pixels)"
            raise ValueError(f"{caller} needs {needed}; got images=None.")
        return _stored(store, batch_size)
    if store is not None and not need_images:
        if not isinstance(images, Tensor):
            raise TypeError(
                f"With a store, {caller} reads the units from its rows: pass images=None, or "
                f"the images it was written from as one tensor; got {type(images).__name__}."
            )
        store.check_images(images)
        return _stored(store, batch_size)
    if store is not None and isinstance(images, Tensor):
        store.check_images(images)
    data = (images,) if isinstance(images, Tensor) else images
    count = labelled_batches(data, batch_size, caller)[1]
    if store is not None and count != store.manifest["images"]:
        raise ValueError(
            f"The store {store.folder} holds {store.manifest['images']} images; {count} were "
            "given. Pass the images it was written from, in the same order."
        )

    def batches() -> Iterator[tuple[Tensor, Tensor | None, range]]:
        start = 0
        for x, labels, _ in labelled_batches(data, batch_size, caller)[0]:
            yield x, labels, range(start, start + len(x))
            start += len(x)

    return ProbeSet(batches, count)


def _stored(store: ActivationStore, batch_size: int) -> ProbeSet:
    count = store.manifest["images"]

    def batches() -> Iterator[tuple[None, None, range]]:
        for start in range(0, count, batch_size):
            yield None, None, range(start, min(start + batch_size, count))

    return ProbeSet(batches, count)
