"""Shape clips: generated videos whose class is one Shapes object moving across a still scene.

Each clip is a Shapes background with its distractors (`render_shapes` without its object),
the same in every frame, and one target object (one of the 10 shapes, its scale, rotation and
colour drawn as Shapes draws them) moving in a straight line from one position to another. The
object can be shown in some frames only (``shown``), and a decoy (another class, on its own
path) drawn in the others: a planted video whose class only those frames decide. The same
arguments give the same bytes on every machine (numpy's PCG64, seeded by the arguments).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .normalize import normalize
from .shapes import (
    _SPLIT_IDS,
    SHAPE_CLASSES,
    SHAPES_MEAN,
    SHAPES_STD,
    object_colour,
    object_masks,
    render_shapes,
)

__all__ = ["CLIP_CLASSES", "PLANTED_FRAMES", "ShapeClips", "render_shape_clips", "shape_clips"]

# the planted task of `ShapeClips`: which of three shapes (or none) the last two of four frames
# show, after two frames of decoys (any other shape)
PLANTED_FRAMES = (False, False, True, True)
_PLANTED_SHAPES = (-1, 1, 4, 7)  # none, square, cross, crescent
CLIP_CLASSES = ("none", *(SHAPE_CLASSES[c] for c in _PLANTED_SHAPES[1:]))
CLIP_SPLIT_SIZES = {"train": 8192, "test": 512}


def render_shape_clips(
    n: int, frames: int = 4, size: int = 32, seed: int = 0, split: str = "train",
    shown: Sequence[bool] | None = None, decoys: bool = False,
    classes: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Generate ``n`` clips of ``frames`` frames.

    Args:
        shown: (frames,) whether the target object is drawn in each frame (default: all).
        decoys: in the frames without the target, draw an object of another class (any of the
            10 shapes but the clip's own) moving on a path of its own, which decides nothing.
        classes: the classes the targets are drawn from, balanced (default: all 10); -1 is a
            clip without a target (its label -1).

    Returns:
        clips (n, T, H, W, 3) uint8, labels (n,) int64, masks (n, T, H, W) bool: the target's
        pixels in each frame (none where it is not shown).
    """
    shown = np.ones(frames, bool) if shown is None else np.asarray(shown, dtype=bool)
    if frames < 1 or shown.shape != (frames,) or not shown.any():
        raise ValueError(
            f"shown must be {frames} booleans, one per frame, at least one True; got "
            f"{shown.tolist()}."
        )
    classes = np.arange(len(SHAPE_CLASSES)) if classes is None else np.asarray(classes)
    valid = classes.ndim == 1 and len(set(classes.tolist())) == len(classes) >= 1
    if not valid or not np.isin(classes, range(-1, len(SHAPE_CLASSES))).all():
        raise ValueError(
            f"classes must be distinct shape classes in 0..9, or -1 (no target); got "
            f"{classes.tolist()}."
        )
    background = render_shapes(n, size, seed, split, objects=np.full(n, -1))[0]
    rng = np.random.Generator(np.random.PCG64([seed, _SPLIT_IDS[split], size, frames, 74]))
    labels = classes[rng.permutation(np.arange(n) % len(classes))]
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1
    gy, gx = np.meshgrid(coords, coords, indexing="ij")
    light = background.reshape(n, -1).mean(1)[:, None, None, None] > 127.5
    clips = np.repeat(background[:, None].astype(np.float32) / 255, frames, axis=1)
    masks = np.zeros((n, frames, size, size), dtype=bool)
    decoy_labels = np.array([_other(rng, c) for c in labels])
    for objects, frames_drawn, keep in ((labels, shown, True), (decoy_labels, ~shown, False)):
        if not keep and not decoys:
            break
        path = _path(rng, n, frames)
        colour = object_colour(rng.uniform(0, 1, (n, 1, 1, 3)), light)
        for t in np.flatnonzero(frames_drawn):
            drawn = object_masks(objects, (gx, gy), path["scale"], path["centres"][t],
                                 path["theta"])  # fmt: skip
            clips[:, t] = np.where(drawn[..., None], colour, clips[:, t])
            if keep:
                masks[:, t] = drawn
    return (clips.clip(0, 1) * 255).round().astype(np.uint8), labels.astype(np.int64), masks


def _other(rng: np.random.Generator, label: int) -> int:
    """A shape class other than ``label``."""
    shapes = np.arange(len(SHAPE_CLASSES))
    return int(rng.choice(shapes[shapes != label]))


def _path(rng: np.random.Generator, n: int, frames: int) -> dict[str, np.ndarray]:
    """Scale, rotation and per-frame centres (frames of (n, 2, 1, 1)) of n objects moving in a
    straight line between two random positions that keep them inside the frame."""
    scale = rng.uniform(0.45, 0.65, (n, 1, 1))
    theta = rng.uniform(-math.pi / 4, math.pi / 4, (n, 1, 1))
    start, end = (rng.uniform(-1, 1, (n, 2, 1, 1)) * (1 - scale[:, None]) for _ in range(2))
    steps = np.linspace(0, 1, frames) if frames > 1 else np.zeros(1)
    return {"scale": scale, "theta": theta, "centres": [start + (end - start) * s for s in steps]}


def shape_clips(
    n: int, frames: int = 4, size: int = 32, seed: int = 0, split: str = "train", **options
) -> tuple[Tensor, Tensor, Tensor]:
    """`render_shape_clips` as a model takes them: clips (n, T, 3, H, W) float32 normalized
    with the Shapes statistics, labels (n,), masks (n, T, H, W) bool."""
    clips, labels, masks = render_shape_clips(n, frames, size, seed, split, **options)
    video = torch.from_numpy(clips).permute(0, 1, 4, 2, 3).float() / 255
    return (
        normalize(video, SHAPES_MEAN, SHAPES_STD),
        torch.from_numpy(labels),
        torch.from_numpy(masks),
    )


class ShapeClips(Dataset):
    """The planted video task: clips of four 32 x 32 frames whose class (`CLIP_CLASSES`: none,
    square, cross, crescent) is the target the last two frames show (`PLANTED_FRAMES`), after
    two frames of a decoy of another shape (`render_shape_clips` with ``decoys=True``).

    Args:
        split: "train" (8,192 clips) or "test" (512); different generator streams.
        n: number of clips (default: the split's size).

    Items are ``(clip (4, 3, 32, 32) float32 normalized with SHAPES_MEAN/STD, label, masks
    (4, 32, 32) bool of the target)``.
    """

    classes = CLIP_CLASSES
    mean, std = SHAPES_MEAN, SHAPES_STD

    def __init__(self, split: str = "train", n: int | None = None, seed: int = 0) -> None:
        if split not in CLIP_SPLIT_SIZES:
            raise ValueError(f"split must be one of {list(CLIP_SPLIT_SIZES)}; got {split!r}.")
        n = CLIP_SPLIT_SIZES[split] if n is None else n
        clips, labels, masks = render_shape_clips(
            n, seed=seed, split=split, shown=PLANTED_FRAMES, decoys=True, classes=_PLANTED_SHAPES
        )
        self.clips = torch.from_numpy(clips).permute(0, 1, 4, 2, 3).contiguous()  # uint8
        self.labels = torch.from_numpy(np.searchsorted(_PLANTED_SHAPES, labels))
        self.masks = torch.from_numpy(masks)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, int, Tensor]:
        clip = normalize(self.clips[i].float() / 255, self.mean, self.std)
        return clip, int(self.labels[i]), self.masks[i]
