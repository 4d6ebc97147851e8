"""The user's own videos in one call: frames from a folder or an array, for a video model."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from ..hooks.inputs import video_input
from .image_folder import readable_images
from .model_input import Preprocessing
from .user_images import load_images

__all__ = ["LoadedVideos", "frame_indices", "load_video"]

VideoSource = str | os.PathLike | np.ndarray | Tensor


class _Loaded(NamedTuple):
    x: Tensor
    shown: np.ndarray
    names: list[str]


class LoadedVideos(_Loaded):
    """Clips prepared for a video model; unpacks as ``x, shown, names``.

    Attributes:
        x: (B, T, 3, H, W) float32, T the frames the model takes, normalized as it was trained.
        shown: (B, T, H, W, 3) uint8 RGB, the same frames before normalization (for figures).
        names: one name per clip: its folder's name, or ``video {i}`` for arrays.
        frames: (B, T) the index of each frame taken in its clip.
        preprocessing: how the frames were prepared (`Preprocessing`).
    """

    frames: np.ndarray | None = None
    preprocessing: Preprocessing | None = None

    def __repr__(self) -> str:
        how = "" if self.preprocessing is None else f"; {self.preprocessing}"
        return f"LoadedVideos({len(self.names)} clips {tuple(self.x.shape)}{how})"


def frame_indices(available: int, frames: int, sampling: str | int = "uniform") -> np.ndarray:
    """(frames,) indices of the frames to take from a clip of ``available`` frames:
    ``"uniform"``, spread evenly over the whole clip (the centres of ``frames`` equal segments,
    as TSN and VideoMAE's Something-Something evaluation sample); an int k, every k-th frame
    from the first (transformers' video-classification pipeline's ``frame_sampling_rate``;
    VideoMAE's Kinetics evaluation: 4)."""
    if isinstance(sampling, str):
        if sampling != "uniform":
            raise ValueError(f"sampling must be 'uniform' or an int stride; got {sampling!r}.")
        return ((np.arange(frames) + 0.5) * available / frames).astype(np.int64)
    if isinstance(sampling, bool) or not isinstance(sampling, int) or sampling < 1:
        raise ValueError(f"sampling must be 'uniform' or an int stride >= 1; got {sampling!r}.")
    needed = (frames - 1) * sampling + 1
    if needed > available:
        raise ValueError(
            f"Every {sampling}th of {frames} frames needs {needed} frames; the clip has "
            f"{available}. Pass sampling='uniform' or a smaller stride."
        )
    return np.arange(frames) * sampling


def load_video(
    source: VideoSource | Sequence[VideoSource],
    model: nn.Module,
    sampling: str | int = "uniform",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> LoadedVideos:
    """Read clips for a video ``model``: the frames it takes (its config's ``num_frames``,
    sampled by `frame_indices`), each resized, cropped and normalized as the model's own image
    processor does (`vizkit.datasets.model_preprocessing`, as `load_images`).

    Args:
        source: one clip, a folder of frame images (sorted by name) or an array or tensor of
            its frames (N, H, W, 3) / (N, 3, H, W), uint8 or floats in [0, 1]; or a list of
            clips.
        model: the video model the clips are for.
        sampling: "uniform" or an int stride (`frame_indices`).
        mean, std: per-channel statistics to use instead of the model's.

    Returns:
        `LoadedVideos` ``(x, shown, names)``: ``x`` (B, T, 3, H, W) goes to any analysis that
        takes videos, ``shown`` to figures; ``.frames`` the indices taken.

    Raises:
        ValueError: a model that takes images (use `load_images`), a clip with fewer frames
        than the sampling needs, an empty list. FileNotFoundError: a missing folder.
    """
    video = video_input(model)
    if video is None:
        raise ValueError(
            f"{type(model).__name__} takes images, not videos: use "
            "vk.datasets.load_images(images, model)."
        )
    clips = list(source) if isinstance(source, (list, tuple)) else [source]
    if not clips:
        raise ValueError("source is an empty list; pass at least one clip.")
    xs, shown, names, taken, preprocessing = [], [], [], [], None
    for i, clip in enumerate(clips):
        frames, name = _frames(clip, i)
        indices = frame_indices(len(frames), video.frames, sampling)
        loaded = load_images([frames[j] for j in indices], model, mean, std)
        xs.append(loaded.x)
        shown.append(loaded.shown)
        names.append(name)
        taken.append(indices)
        preprocessing = loaded.preprocessing
    result = LoadedVideos(torch.stack(xs), np.stack(shown), names)
    result.frames, result.preprocessing = np.stack(taken), preprocessing
    return result


def _frames(clip: VideoSource, i: int) -> tuple[list, str]:
    """The frames of one clip (file paths or arrays, in order) and its name."""
    if isinstance(clip, (str, os.PathLike)):
        folder = Path(clip)
        if not folder.is_dir():
            raise FileNotFoundError(f"No folder of frames at {folder}.")
        files = readable_images(folder)  # sorted by name; refuses a folder without images
        return [str(f) for f in files], folder.name
    if isinstance(clip, (np.ndarray, Tensor)):
        if clip.ndim != 4:
            raise ValueError(
                f"A clip's frames are (N, H, W, 3) or (N, 3, H, W); got shape {tuple(clip.shape)}."
                " A batch of clips is a list of them."
            )
        return list(clip), f"video {i}"
    raise TypeError(f"A clip is a folder of frames or an array of them; got {type(clip).__name__}.")
