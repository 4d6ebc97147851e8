"""The user's own images in one call: files, a folder, PIL images or arrays, for a model."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch import Tensor, nn

from .image_folder import UNREADABLE, as_viewed_rgb, read_image, readable_images
from .model_input import Preprocessing, model_preprocessing
from .normalize import denormalize

__all__ = ["LoadedImages", "load_images"]

ImageSource = str | os.PathLike | Image.Image | np.ndarray | Tensor


class _Loaded(NamedTuple):
    x: Tensor
    shown: np.ndarray
    names: list[str]


class LoadedImages(_Loaded):
    """Images prepared for a model; unpacks as ``x, shown, names``.

    Attributes:
        x: (B, 3, H, W) float32 at the model's input size, normalized as it was trained.
        shown: (B, H, W, 3) uint8 RGB, the same pixels before normalization (for figures).
        names: one name per image: the file name, or ``image {i}`` for in-memory images.
        preprocessing: how they were prepared (`Preprocessing`: size, statistics, and the
            library they were read from).
    """

    preprocessing: Preprocessing | None = None

    def __repr__(self) -> str:
        names = ", ".join(self.names[:3]) + (", ..." if len(self.names) > 3 else "")
        how = "" if self.preprocessing is None else f"; {self.preprocessing}"
        return f"LoadedImages({len(self.names)} images {tuple(self.x.shape)} [{names}]{how})"


def load_images(
    source: ImageSource | Sequence[ImageSource],
    model: nn.Module,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    size: int | tuple[int, int] | None = None,
) -> LoadedImages:
    """Read, resize, crop and normalize images for ``model`` as its own library prepares them
    (`vizkit.datasets.model_preprocessing`: timm's data config at the size its patch embedding
    was built for, e.g. ``img_size=(224, 320)``; the Hugging Face image processor of the
    checkpoint, or of its model type for a model built from a config; open_clip's preprocess
    config). The result says which (``.preprocessing``).

    Args:
        source: an image file, a folder (its readable images, sorted by name; others are skipped
            with a warning), a PIL image, an array or tensor of one image (H, W, 3) / (3, H, W)
            or a batch (B, H, W, 3) / (B, 3, H, W) (uint8, or floats in [0, 1]; grey (H, W)
            too), or a list of these.
        model: the model the images are for.
        mean, std: per-channel statistics to use instead of the model's.
        size: an int or (H, W) to use instead of the model's input size.

    Returns:
        `LoadedImages` ``(x, shown, names)``: ``x`` goes to any analysis, ``shown`` to figures.

    Raises:
        FileNotFoundError: a path that does not exist. ValueError: a folder without readable
        images, an empty list, an array that is not an image. TypeError: another kind of source.

    >>> import vizkit as vk
    >>> model, _ = vk.zoo.load("vit_tiny_shapes")
    >>> x, shown, names = vk.datasets.load_images(np.zeros((40, 50, 3), np.uint8), model)
    >>> tuple(x.shape), shown.shape, names
    ((1, 3, 32, 32), (1, 32, 32, 3), ['image 0'])
    """
    images, names = _pil_images(source)
    preprocessing = model_preprocessing(model, mean, std, size)
    transform = create_transform(**preprocessing.data_config())
    x = torch.stack([transform(image) for image in images])
    shown = denormalize(x, preprocessing.mean, preprocessing.std).clamp(0, 1)
    shown = (shown * 255).round().byte().permute(0, 2, 3, 1).numpy()
    loaded = LoadedImages(x, shown, names)
    loaded.preprocessing = preprocessing
    return loaded


def _pil_images(source: object) -> tuple[list[Image.Image], list[str]]:
    """RGB PIL images from any accepted ``source``, with their names (``image {i}``, i the
    position in the batch, for in-memory images)."""
    images, names = [], []
    for item in source if isinstance(source, (list, tuple)) else [source]:
        more, files = _one_source(item)
        names += files or [f"image {len(images) + i}" for i in range(len(more))]
        images += more
    if not images:
        raise ValueError("source is an empty list; pass at least one image or file.")
    return images, names


def _one_source(source: object) -> tuple[list[Image.Image], list[str] | None]:
    """The images of one source and their file names (None for in-memory images)."""
    if isinstance(source, (str, os.PathLike)):
        return _from_path(Path(source))
    if isinstance(source, Image.Image):
        return [as_viewed_rgb(source)], None
    if isinstance(source, (np.ndarray, Tensor)):
        return [Image.fromarray(a) for a in _image_arrays(source)], None
    raise TypeError(
        f"source must be a file or folder path, a PIL image, an array or tensor of images, or a "
        f"list of these; got {type(source).__name__}."
    )


def _from_path(path: Path) -> tuple[list[Image.Image], list[str]]:
    if path.is_dir():
        files = readable_images(path)
        return [read_image(f) for f in files], [f.name for f in files]
    if not path.exists():
        raise FileNotFoundError(f"No image file or folder at {path}.")
    try:
        return [read_image(path)], [path.name]
    except UNREADABLE as error:  # name the file: it may be one of a list
        raise type(error)(f"{path}: {error}") from error


def _image_arrays(value: np.ndarray | Tensor) -> list[np.ndarray]:
    """(H, W, 3) uint8 arrays from an array or tensor of one image or a batch, channels last or
    first (a tensor's default), uint8 or floats in [0, 1]."""
    array = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value)
    shape = array.shape
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4:
        raise ValueError(f"An image array is (H, W, 3), (3, H, W) or a batch of them; got {shape}.")
    if array.shape[1] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(0, 2, 3, 1)  # channels first -> last
    if array.shape[-1] not in (1, 3):
        raise ValueError(
            f"Cannot find the colour axis of an image array of shape {shape}: it needs 1 or 3 "
            "channels first or last, (H, W, 3) / (3, H, W) or a batch (B, ...) of them."
        )
    return [np.repeat(a, 3, axis=-1) if a.shape[-1] == 1 else a for a in _to_uint8(array, shape)]


def _to_uint8(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind != "f" or not np.isfinite(array).all():
        raise ValueError(
            f"Image arrays are uint8 (0-255) or finite floats in [0, 1]; got {array.dtype} of "
            f"shape {shape}."
        )
    if array.min() < 0 or array.max() > 1:
        raise ValueError(
            f"Float image arrays must hold values in [0, 1] (got {array.min():.3g} to "
            f"{array.max():.3g}); already normalized images go to the analyses directly."
        )
    return (array * 255).round().astype(np.uint8)
