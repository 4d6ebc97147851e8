"""`SaliencyResult`: one map per image, from any attribution method, with its metadata."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ..hooks import TokenLayout
from ..hooks.inputs import check_count, check_maps, check_values_finite
from ..hooks.layout import covers
from .result import Result

__all__ = [
    "SaliencyResult",
    "check_maps_fit",
    "constant_maps",
    "frame_maps",
    "min_max",
    "rank_descending",
    "saliency_maps",
]


def check_maps_fit(
    maps: Tensor,
    batch: int,
    image_size: tuple[int, int],
    of: str = "images",
    frames: int | None = None,
) -> None:
    """Raise unless ``maps`` is a real (batch, h, w) tensor, batch >= 1, with h and w dividing
    ``image_size`` (H, W) of the ``of`` ("images" or "masks") they are scored against; for clips
    of ``frames`` T frames, (batch, F, h, w) with F dividing T (token frames or frames)."""
    axes = "(B, h, w)" if frames is None else "(B, F, h, w)"
    check_maps("saliency maps", maps, axes, ndim=3 if frames is None else 4)
    if len(maps) != batch:
        raise ValueError(
            f"Expected {batch} saliency maps (B={batch}, {axes[4:]} for the {of}; got "
            f"{tuple(maps.shape)}. Pass one map per image, in the order of the {of}."
        )
    if frames is not None and frames % maps.shape[1]:
        raise ValueError(
            f"Saliency maps of {maps.shape[1]} frames do not tile clips of {frames} frames; "
            "pass maps of the clips' frames or of the model's token frames."
        )
    (h, w), (height, width) = maps.shape[-2:], image_size
    if height % h or width % w:
        raise ValueError(
            f"Saliency maps of {h}x{w} do not tile the {height}x{width} {of}; pass maps at "
            "the image size, the patch grid or another divisor of the image size."
        )


def saliency_maps(
    saliency: SaliencyResult | Tensor,
    batch: int,
    image_size: tuple[int, int],
    of: str = "images",
    allow_constant: bool = False,
    frames: int | None = None,
) -> Tensor:
    """The maps (B, h, w) of ``saliency``, checked for scoring against ``batch`` ``of`` ("images"
    or "masks") of ``image_size`` (H, W): shapes as in `check_maps_fit`, a SaliencyResult's
    ``image_size`` equal to (H, W), every value finite (NaN / Inf samples are named), and no map
    constant (unless ``allow_constant``: the caller leaves those samples out). For clips of
    ``frames`` T frames, a video's maps (B, F, h, w), F dividing T; a map constant over the
    whole clip counts as constant."""
    if isinstance(saliency, SaliencyResult):
        _check_result_frames(saliency, frames, of)
        _check_result_size(saliency, image_size, of)
        saliency = saliency.maps
    check_maps_fit(saliency, batch, image_size, of, frames)
    check_values_finite("The saliency maps", saliency)
    flat = constant_maps(saliency)
    if not allow_constant and bool(flat.any()):
        raise ValueError(
            f"The saliency maps of samples {flat.nonzero()[:, 0].tolist()[:10]} are constant: "
            "they rank no pixel above another, so any score would grade an arbitrary order "
            "(a Grad-CAM of a layer the target does not depend on is all zeros). Choose "
            "another layer or method, or drop those samples."
        )
    return saliency


def _check_result_frames(result: SaliencyResult, frames: int | None, of: str) -> None:
    """Raise a ValueError unless ``result``'s maps are a video's exactly when ``frames`` (the
    T frames of the clips or masks scored) is given."""
    if result.frames is not None and frames is None:
        what = "images (B, C, H, W)" if of == "images" else "masks of images (B, H, W)"
        raise ValueError(
            f"These {result.method} maps are a video's (B, {result.frames}, h, w), but they "
            f"are scored against {what}: score them against the clips they were computed for "
            "(B, T, C, H, W), or masks of every frame of those clips (B, T, H, W)."
        )
    if result.frames is None and frames is not None:
        what = f"clips of {frames} frames" if of == "images" else f"masks of {frames} frames"
        raise ValueError(
            f"These {result.method} maps are images' (B, h, w), but they are scored against "
            f"{what}: compute the maps of the clips (a video model's methods take them), or "
            "score images' maps against images and masks (B, H, W)."
        )


def frame_maps(maps: Tensor, frames: int) -> Tensor:
    """A clip's maps (B, F, h, w) on each of its ``frames`` T frames, (B, T, h, w): a token
    frame's map repeated over the T / F frames of its tubelet."""
    return maps.repeat_interleave(frames // maps.shape[1], dim=1)


def constant_maps(maps: Tensor) -> Tensor:
    """(B,) bool: which of the maps (B, ...) are constant (rank no pixel above another)."""
    values = maps.flatten(1)
    return (values == values[:, :1]).all(1)


def _check_result_size(result: SaliencyResult, image_size: tuple[int, int], of: str) -> None:
    """Raise a ValueError unless ``result`` was computed for images of ``image_size`` (H, W)."""
    if tuple(result.image_size) == tuple(image_size):
        return
    (h, w), (height, width) = result.image_size, image_size
    fix = "pass the images they were computed for" if of == "images" else "pass masks that size"
    raise ValueError(
        f"These {result.method} maps were computed for {h}x{w} images "
        f"(SaliencyResult.image_size) but the {of} given are {height}x{width}; {fix}, or "
        "recompute the maps for these images."
    )


def rank_descending(values: Tensor) -> Tensor:
    """Rank of each entry of (B, K) within its row, 0 = largest; ties keep their order."""
    order = values.argsort(dim=1, descending=True, stable=True)
    positions = torch.arange(values.shape[1], device=values.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)


def min_max(maps: Tensor) -> Tensor:
    """Scale each map (B, ...) to [0, 1] by its own minimum and maximum (constant maps give 0)."""
    flat = maps.flatten(1)
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    return ((flat - low) / (high - low).clamp_min(1e-12)).view_as(maps)


@dataclass(repr=False)
class SaliencyResult(Result):
    """Saliency maps of a batch.

    Attributes:
        maps: (B, h, w): on the patch grid (gh, gw) or in pixels (H, W); higher = more salient.
            A video's (B, frames, h, w): T' token frames on its token grid (``layout.frames``),
            or its T frames in pixels.
        method: what produced them (``"rollout"``, ``"gradcam"``, ...).
        image_size: (H, W) of the input images.
        options: the method's settings (layer, head fusion, ...).
        layout: token layout for patch-grid maps, None for pixel maps and CNNs.
        targets: (B,) the class each map explains, None for class-agnostic methods.
        extras: further tensors of the method, e.g. ``per_head`` (B, H, gh, gw).
        frames: the frame axis of a video's maps (``layout.frames`` for token maps); None for
            images.
    """

    maps: Tensor
    method: str
    image_size: tuple[int, int]
    options: dict = field(default_factory=dict)
    layout: TokenLayout | None = None
    targets: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    frames: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.maps, Tensor):
            raise TypeError(f"maps must be a tensor (B, h, w); got {type(self.maps).__name__}.")
        if not isinstance(self.image_size, (tuple, list)) or len(self.image_size) != 2:
            raise ValueError(f"image_size must be (H, W); got {self.image_size!r}.")
        self.image_size = tuple(check_count("image_size", s) for s in self.image_size)
        if self.frames is None and self.layout is not None:
            self.frames = self.layout.frames
        frames = self.frames
        if self.layout is not None and frames != self.layout.frames:
            raise ValueError(f"frames={frames} but the token layout has {self.layout.frames}.")
        shape = "(B, h, w)" if frames is None else f"a video's (B, {frames}, h, w)"
        if self.maps.ndim != (3 if frames is None else 4) or (
            frames is not None and self.maps.shape[1] != frames
        ):
            raise ValueError(f"maps must be {shape}; got shape {tuple(self.maps.shape)}.")
        check_values_finite("The saliency maps", self.maps)  # no method hands on NaN maps
        (h, w), (height, width) = self.maps.shape[-2:], self.image_size
        if not covers(h, w, self.image_size):
            raise ValueError(
                f"A {h}x{w} map cannot cover a {height}x{width} image: the activation was read "
                "in the wrong layout, e.g. channels-last (B, h, w, C) as (B, C, h, w)."
            )
        if self.layout is not None and tuple(self.maps.shape[1:]) != self.layout.cells:
            raise ValueError(
                f"maps are {'x'.join(map(str, self.maps.shape[1:]))} but the token grid is "
                f"{'x'.join(map(str, self.layout.cells))}."
            )

    def upsample(self, mode: str = "bilinear") -> Tensor:
        """Maps resized to the image: (B, H, W); a video's each frame on its own,
        (B, frames, H, W) (a token frame spans a tubelet's frames). ``mode``: "bilinear" or
        "nearest"."""
        if tuple(self.maps.shape[-2:]) == tuple(self.image_size):
            return self.maps
        if mode not in ("bilinear", "nearest"):
            raise ValueError(f"mode must be 'bilinear' or 'nearest'; got {mode!r}.")
        extra = {"align_corners": False} if mode == "bilinear" else {}
        frames = self.maps if self.frames is not None else self.maps[:, None]  # (B, T', h, w)
        up = F.interpolate(frames.float(), size=self.image_size, mode=mode, **extra)
        return (up if self.frames is not None else up[:, 0]).to(self.maps.dtype)

    def frame_shares(self) -> Tensor:
        """(B, frames) each frame's share of its clip's |map| (rows sum to 1; a map that is 0
        everywhere shares nothing: its row is 0)."""
        if self.frames is None:
            raise ValueError(f"These {self.method} maps are of images, not clips: no frames.")
        per_frame = self.maps.abs().flatten(2).sum(-1).double()
        return (per_frame / per_frame.sum(1, keepdim=True).clamp_min(1e-300)).float()

    def normalized(self) -> Tensor:
        """Maps min-max scaled to [0, 1] per image (a video's over all its frames): the shape
        of ``maps``."""
        return min_max(self.maps)
