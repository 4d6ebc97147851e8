"""Shapes: a generated classification set whose class is one object, with its ground-truth mask.

Each image holds one target object (one of 10 shapes) at a random position, scale, rotation and
colour, drawn over a textured background (two coloured sinusoidal gratings plus pixel noise) and
distractors (thin line segments and dots, which belong to no class). The target is drawn last, so
its mask is exactly the pixels it covers. Everything comes from numpy's PCG64 generator seeded by
(seed, split), so the same arguments give the same bytes on every machine.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..runs import replaced_whole
from .normalize import normalize

__all__ = [
    "SAMPLE_FILE",
    "SHAPE_CLASSES",
    "SHAPES_MEAN",
    "SHAPES_STD",
    "Shapes",
    "counterfactual_shapes",
    "load_sample",
    "render_shapes",
    "write_sample",
]

SHAPE_CLASSES = (
    "circle", "square", "triangle", "ring", "cross", "star", "ell", "crescent", "tee", "frame",
)  # fmt: skip
SHAPES_MEAN = (0.5, 0.5, 0.5)  # normalization chosen for [0, 1] images, not fitted
SHAPES_STD = (0.25, 0.25, 0.25)
SPLIT_SIZES = {"train": 50_000, "test": 2_000}
_SPLIT_IDS = {"train": 0, "test": 1}
SAMPLE_FILE = Path(__file__).resolve().parent / "shapes_sample.npz"  # package data
SAMPLE_SIZE = 64


def _inside(cls: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Whether object-frame points (x, y) (unit radius) lie inside shape ``cls``."""
    r = np.hypot(x, y)
    ax, ay = np.abs(x), np.abs(y)
    if cls == 0:  # circle
        return r <= 1.0
    if cls == 1:  # square
        return np.maximum(ax, ay) <= 0.8
    if cls == 2:  # equilateral triangle, pointing up
        return (y >= -0.5) & (math.sqrt(3) * ax + y <= 1.0)
    if cls == 3:  # ring
        return (r <= 1.0) & (r >= 0.55)
    if cls == 4:  # plus-shaped cross
        return ((ax <= 0.38) & (ay <= 1.0)) | ((ay <= 0.38) & (ax <= 1.0))
    if cls == 5:  # five-pointed star
        phi = np.arctan2(y, x)
        return r <= 0.5 + 0.5 * np.abs(np.cos(2.5 * phi)) ** 1.5
    if cls == 6:  # L: a vertical and a horizontal bar meeting at a corner
        return (ax <= 0.9) & (ay <= 0.9) & ((x <= -0.35) | (y <= -0.35))
    if cls == 7:  # crescent
        return (r <= 1.0) & (np.hypot(x - 0.45, y) > 0.8)
    if cls == 8:  # T
        return ((ax <= 1.0) & (y >= 0.35) & (y <= 1.0)) | ((ax <= 0.36) & (ay <= 1.0))
    if cls == 9:  # square frame
        m = np.maximum(ax, ay)
        return (m <= 0.9) & (m >= 0.55)
    raise ValueError(f"Shape class must be 0..9; got {cls}.")


def object_masks(
    labels: np.ndarray, grid: tuple[np.ndarray, np.ndarray], scale: np.ndarray,
    centre: np.ndarray, theta: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """(n, H, W) bool: the pixels of each image's object of class ``labels`` (n,) (-1: none),
    the unit shape scaled by ``scale`` (n, 1, 1), rotated by ``theta`` (n, 1, 1) and moved to
    ``centre`` (n, 2, 1, 1) (x, y in [-1, 1]), over the pixel-centre ``grid`` (gx, gy)."""
    gx, gy = grid
    dx, dy = gx - centre[:, 0], gy - centre[:, 1]
    x = (np.cos(theta) * dx + np.sin(theta) * dy) / scale  # object frame
    y = (-np.sin(theta) * dx + np.cos(theta) * dy) / scale
    masks = np.zeros((len(labels), *gx.shape), dtype=bool)
    for cls in range(len(SHAPE_CLASSES)):
        idx = np.flatnonzero(labels == cls)
        masks[idx] = _inside(cls, x[idx], y[idx])
    return masks


def object_colour(hue: np.ndarray, light: np.ndarray) -> np.ndarray:
    """An object's colour from its ``hue`` (n, 1, 1, 3) in [0, 1], with the luminance opposite
    to the background's (``light`` (n, 1, 1, 1): dark on light, bright on dark)."""
    return np.where(light, 0.3 * hue, 0.7 + 0.3 * hue)


def _segments_mask(rng, n, grid, count, width) -> np.ndarray:
    """(n, H, W) mask of ``count`` random line segments per image (distance to segment <= width)."""
    gx, gy = grid
    mask = np.zeros((n, *gx.shape), dtype=bool)
    for _ in range(count):
        p0 = rng.uniform(-1, 1, (n, 2, 1, 1))
        p1 = p0 + rng.uniform(-0.8, 0.8, (n, 2, 1, 1))
        d = p1 - p0
        t = ((gx - p0[:, 0]) * d[:, 0] + (gy - p0[:, 1]) * d[:, 1]) / (d**2).sum(1).clip(1e-6)
        t = t.clip(0, 1)
        dist = np.hypot(gx - p0[:, 0] - t * d[:, 0], gy - p0[:, 1] - t * d[:, 1])
        mask |= dist <= width
    return mask


def render_shapes(
    n: int, size: int = 32, seed: int = 0, split: str = "train", objects: np.ndarray | None = None,
    details: bool = False,
) -> tuple:  # fmt: skip
    """Generate ``n`` images.

    Args:
        objects: (n,) the class of the object drawn in each image in place of its own (same
            position, scale, rotation and colour; -1: none, the background left), every other
            pixel as without it: counterfactual scenes. None: each image's own class.
        details: also return what else the generator drew (the same images either way).

    Returns:
        images (n, H, W, 3) uint8, labels (n,) int64 (balanced: each class n/10 times, shuffled;
        with ``objects``: those), masks (n, H, W) bool: the pixels of the target object; with
        ``details``, a dict: "distractors" (n, H, W) bool, the lines' and dots' pixels the
        object does not cover; "scale" (n,) the object's scale (0.45 to 0.65); "centre" (n, 2)
        its centre (x, y) in [-1, 1], y down; "hue" (n, 3) the RGB mix its colour is drawn from.
    """
    if split not in _SPLIT_IDS:
        raise ValueError(f"split must be one of {list(_SPLIT_IDS)}; got {split!r}.")
    if size < 16:
        raise ValueError(f"size must be at least 16 pixels to draw the shapes; got {size}.")
    rng = np.random.Generator(np.random.PCG64([seed, _SPLIT_IDS[split], size]))
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1  # pixel centres in [-1, 1]
    gy, gx = np.meshgrid(coords, coords, indexing="ij")  # (H, W)
    labels = rng.permutation(np.arange(n) % len(SHAPE_CLASSES))
    if objects is not None:  # drawn after the permutation: every later draw stays the same
        labels = np.asarray(objects, dtype=np.int64)
        if labels.shape != (n,) or not ((labels >= -1) & (labels < len(SHAPE_CLASSES))).all():
            raise ValueError(
                f"objects must be {n} classes in -1..{len(SHAPE_CLASSES) - 1} (-1: none); got "
                f"shape {labels.shape}, values {np.unique(labels)[:5].tolist()}."
            )

    # background: two coloured gratings + pixel noise, muted
    image = np.empty((n, size, size, 3), dtype=np.float32)
    base = rng.uniform(0.2, 0.8, (n, 1, 1, 3))
    image[:] = base
    for _ in range(2):
        freq = rng.uniform(1.5, 6.0, (n, 1, 1))
        angle = rng.uniform(0, math.pi, (n, 1, 1))
        phase = rng.uniform(0, 2 * math.pi, (n, 1, 1))
        wave = np.sin(freq * math.pi * (gx * np.cos(angle) + gy * np.sin(angle)) + phase)
        image += wave[..., None] * rng.uniform(-0.08, 0.08, (n, 1, 1, 3))
    image += rng.normal(0, 0.04, image.shape)

    # distractors: line segments and dots that belong to no class
    lines = _segments_mask(rng, n, (gx, gy), count=2, width=1.0 / size)
    centres = rng.uniform(-1, 1, (n, 3, 2, 1, 1))
    dots = (np.hypot(gx - centres[:, :, 0], gy - centres[:, :, 1]) <= 1.6 / size).any(1)
    for mask in (lines, dots):
        colour = rng.uniform(0, 1, (n, 1, 1, 3))
        image = np.where(mask[..., None], colour, image)

    # the target: unit shape scaled, rotated and moved, in a colour far from the background base
    scale = rng.uniform(0.45, 0.65, (n, 1, 1))
    centre = rng.uniform(-1, 1, (n, 2, 1, 1)) * (1 - scale[:, None])
    theta = rng.uniform(-math.pi / 4, math.pi / 4, (n, 1, 1))
    masks = object_masks(labels, (gx, gy), scale, centre, theta)
    # random hue, luminance opposite to the background's: dark on light, bright on dark
    hue = rng.uniform(0, 1, (n, 1, 1, 3))
    colour = object_colour(hue, base.mean(-1, keepdims=True) > 0.5)
    image = np.where(masks[..., None], colour, image)
    images = (image.clip(0, 1) * 255).round().astype(np.uint8)
    if not details:
        return images, labels.astype(np.int64), masks
    drawn = {"distractors": (lines | dots) & ~masks, "scale": scale.reshape(n),
             "centre": centre.reshape(n, 2), "hue": hue.reshape(n, 3)}  # fmt: skip
    return images, labels.astype(np.int64), masks, drawn


class Shapes(Dataset):
    """Generated shapes with ground-truth masks; see the module docstring.

    Args:
        split: "train" (50,000 images) or "test" (2,000); different generator streams.
        n: number of images (default: the split's size).
        size: image side in pixels.
        seed: generator seed.

    Items are ``(image (3, H, W) float32 normalized with SHAPES_MEAN/STD, label, mask (H, W))``
    with a bool mask.
    """

    classes = SHAPE_CLASSES
    mean, std = SHAPES_MEAN, SHAPES_STD

    def __init__(self, split: str = "train", n: int | None = None, size: int = 32, seed: int = 0):
        if split not in SPLIT_SIZES:
            raise ValueError(f"split must be one of {list(SPLIT_SIZES)}; got {split!r}.")
        n = SPLIT_SIZES[split] if n is None else n
        if n < 1:
            raise ValueError(f"n must be at least 1; got {n}.")
        images, labels, masks = _rendered(n, size, seed, split)  # copied: the cache stays
        self.images = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())  # (n, 3, H, W)
        self.labels = torch.from_numpy(labels.copy())
        self.masks = torch.from_numpy(masks.copy())

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int, Tensor]:
        image = normalize(self.images[i].float() / 255, self.mean, self.std)
        return image, int(self.labels[i]), self.masks[i]


@functools.lru_cache(maxsize=2)
def _rendered(n: int, size: int, seed: int, split: str) -> tuple[np.ndarray, ...]:
    """`render_shapes`, kept for this process's next dataset of the same arguments (the train
    and test split of a recipe): a sweep's runs in one process render the 50,000 training
    images (about 45 s) once. Read-only, so only a copy can change."""
    arrays = render_shapes(n, size=size, seed=seed, split=split)
    for array in arrays:
        array.setflags(write=False)
    return arrays


def counterfactual_shapes(
    n: int, size: int = 32, seed: int = 0, split: str = "test", replace: str | int = "none"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pairs of one scene rendered twice: as `Shapes` draws it, and with its object removed
    (``replace="none"``: the background and distractors where it was) or another object in its
    place, same position, scale, rotation and colour (``"next"``: class (c + 1) mod 10; a class
    index: that class). Every other pixel is the same in both.

    Returns:
        clean, counterfactual (n, 3, H, W) float32 normalized with SHAPES_MEAN/STD, labels (n,)
        of the clean images, masks (n, H, W) bool of their objects.
    """
    classes = range(len(SHAPE_CLASSES))
    if replace not in ("none", "next") and not (isinstance(replace, int) and replace in classes):
        raise ValueError(
            f"replace must be 'none', 'next' or a class in 0..{len(SHAPE_CLASSES) - 1}; got "
            f"{replace!r}."
        )
    images, labels, masks = render_shapes(n, size, seed, split)
    if replace == "none":
        objects = np.full_like(labels, -1)
    elif replace == "next":
        objects = (labels + 1) % len(SHAPE_CLASSES)
    else:
        objects = np.full_like(labels, replace)
    other = render_shapes(n, size, seed, split, objects=objects)[0]

    def normalized(array: np.ndarray) -> Tensor:
        images = torch.from_numpy(array).permute(0, 3, 1, 2).float() / 255
        return normalize(images, SHAPES_MEAN, SHAPES_STD)

    return normalized(images), normalized(other), torch.from_numpy(labels), torch.from_numpy(masks)


def write_sample(file: str | Path = SAMPLE_FILE, n: int = SAMPLE_SIZE) -> None:
    """Write the committed evaluation sample: the first ``n`` images of the test split (seed 0)."""
    images, labels, masks = render_shapes(n, seed=0, split="test")
    with replaced_whole(file) as partial, open(partial, "wb") as handle:
        np.savez_compressed(handle, images=images, labels=labels, masks=masks)


def load_sample(file: str | Path = SAMPLE_FILE) -> tuple[Tensor, Tensor, Tensor]:
    """The committed evaluation sample (``vizkit/datasets/shapes_sample.npz``, package data).

    Returns:
        images (n, 3, 32, 32) float32 normalized with SHAPES_MEAN/STD, labels (n,), masks
        (n, 32, 32) bool.
    """
    with np.load(file) as sample:
        images = torch.from_numpy(sample["images"]).permute(0, 3, 1, 2).float() / 255
        labels, masks = torch.from_numpy(sample["labels"]), torch.from_numpy(sample["masks"])
    return normalize(images, SHAPES_MEAN, SHAPES_STD), labels, masks
