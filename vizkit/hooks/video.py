"""Video inputs: what a video model takes, (B, T, C, H, W) clips, and which analyses take them.

A video model's family says what it takes (`VideoInput`); its tokens are the clip's T' token
frames (T frames over the tubelet's depth) of gh x gw patches (`TokenLayout.frames`). An
analysis takes videos only where it says so (``analysis_contract(videos=True)``), after its maps,
masks and figures were made to carry the frame axis: everything else refuses a video model with
the list of those that take it, rather than reading a clip as if it were an image.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch import Tensor

__all__ = [
    "VIDEO_ANALYSES",
    "VideoInput",
    "check_video",
    "hook_call",
    "require_video_analysis",
    "running",
]

VIDEO_ANALYSES: set[str] = set()  # filled by analysis_contract(videos=True)

# the analysis running in this context: (its name, whether it takes videos)
_RUNNING: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar(
    "vizkit_running_analysis", default=None
)


@dataclass(frozen=True)
class VideoInput:
    """The clips a video model takes, (B, T, C, H, W).

    Attributes:
        frames: T, the frames of a clip the model was built for.
        tubelet: frames per token frame (the patch embedding's temporal stride): T' = T / tubelet.
        channels: C.
        size: (H, W) of a frame.
    """

    frames: int
    tubelet: int
    channels: int
    size: tuple[int, int]

    @property
    def token_frames(self) -> int:
        return self.frames // self.tubelet


@contextmanager
def running(name: str, videos: bool) -> Iterator[None]:
    """Mark the analysis ``name`` as running in this context, and whether it takes videos."""
    token = _RUNNING.set((name, videos))
    try:
        yield
    finally:
        _RUNNING.reset(token)


@contextmanager
def hook_call(name: str) -> Iterator[None]:
    """The hook API's own ``name`` (`HookedModel`'s call and cache) takes a video model's clips
    as the model does, unless it runs inside an analysis: then that analysis decides."""
    if _RUNNING.get() is not None:
        yield
        return
    with running(name, videos=True):
        yield


def require_video_analysis(model_name: str) -> None:
    """Refuse the video model ``model_name`` unless the analysis running takes videos."""
    name, videos = _RUNNING.get() or ("", False)
    if videos:
        return
    what = f"{name}()" if name and not name.startswith("_") else "this call"
    raise ValueError(
        f"{model_name} takes videos (B, T, C, H, W), and {what} does not take videos yet: its "
        "maps, masks or figures have no frame axis, so it would read a clip as an image. "
        f"Analyses that take videos: {', '.join(sorted(VIDEO_ANALYSES))}."
    )


def check_video(model_name: str, video: VideoInput, x: Tensor) -> None:
    """Raise a ValueError naming the shape ``model_name`` takes unless ``x`` is a batch of its
    clips, (B, T, C, H, W) with T, C, H and W as ``video`` says."""
    t, c, (h, w) = video.frames, video.channels, video.size
    expected = f"(B, {t}, {c}, {h}, {w}) (B clips of {t} frames, {c} channels, {h}x{w})"
    if x.ndim != 5:
        hint = {
            4: " One clip (T, C, H, W) gets its batch axis with x[None]; a batch of images is "
            "not a video.",
        }.get(x.ndim, "")
        raise ValueError(f"{model_name} takes videos {expected}; got {tuple(x.shape)}.{hint}")
    if tuple(x.shape[1:]) == (t, c, h, w):
        return
    if tuple(x.shape[1:3]) == (c, t) and tuple(x.shape[3:]) == (h, w):
        fix = " It looks channels-first (B, C, T, H, W): pass x.permute(0, 2, 1, 3, 4)."
    elif x.shape[1] != t and tuple(x.shape[2:]) == (c, h, w):
        fix = (
            f" Sample {t} frames from each clip as the model was trained "
            f"(vk.datasets.load_video(frames, model) does it)."
        )
    elif tuple(x.shape[3:]) != (h, w):
        fix = f" Resize the frames to {h}x{w} (vk.datasets.load_video(frames, model) does it)."
    else:
        fix = ""
    raise ValueError(f"{model_name} takes videos {expected}; got {tuple(x.shape)}.{fix}")
