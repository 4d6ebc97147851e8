"""The region a dense target explains, outlined over the image: what a map of
``vk.targets.segment(class, mask)``, ``depth_region(mask)``, ``depth_difference(near, far)`` or
``pixel(class, y, x, size)`` explains is the score over that region, so a figure of the map can
draw the region's contour (a box mask's contour is the box) on the image.

>>> import vizkit as vk
>>> mask = vk.targets.box_mask((1, 1, 2, 3), (4, 6))
>>> [(name, int(region.sum())) for name, region in target_regions(mask, 0)]
[('region', 6)]
>>> xs, ys = contour(region_of(mask), (4, 6))
>>> sorted({(x, y) for x, y in zip(xs, ys) if x is not None})  # the box's corners, in pixels
[(0.5, 0.5), (0.5, 2.5), (3.5, 0.5), (3.5, 2.5)]
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor

from ..targets.dense import DepthDifference, DepthRegion, Pixel, Segment

__all__ = ["Region", "contour", "outline_regions", "region_label", "region_of", "target_regions"]

Region = Tensor | Segment | DepthRegion | DepthDifference | Pixel  # what ``region=`` takes
LINES = (("#ff2d2d", "solid"), ("#ff2dff", "dash"))  # the first region's, the second's
LINE_NAMES = ("red", "magenta, dashed")


def region_of(mask: Tensor, image: int = 0) -> np.ndarray:
    """(H, W) bool: the pixels of ``mask`` ((H, W) for every image, or (B, H, W) one per image;
    bool or weights) that are in the region (weight > 0) on image ``image``."""
    if not isinstance(mask, Tensor) or mask.ndim not in (2, 3):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"A region mask must be a (H, W) or (B, H, W) tensor; got {shape}.")
    if mask.ndim == 3:
        if not -len(mask) <= image < len(mask):
            raise ValueError(
                f"image {image} has no mask: {len(mask)} masks (B, H, W); give one per image, "
                "or one (H, W) mask for all."
            )
        mask = mask[image]
    return (mask.detach().float().cpu() > 0).numpy()


def target_regions(region: Region, image: int = 0) -> list[tuple[str, np.ndarray]]:
    """The named (H, W) bool regions that ``region`` outlines on image ``image``: a mask's
    pixels ("region"), the mask of `segment(class, mask)` or `depth_region` ("mask"), the two
    of `depth_difference` ("near", "far"), the pixel of `pixel(class, y, x, size)`."""
    if isinstance(region, Tensor):
        return [("region", region_of(region, image))]
    if isinstance(region, Segment | DepthRegion):
        if region.mask is None:
            raise ValueError(
                f"{region!r} scores the pixels the class wins in the model's output, which the "
                "figure does not have: pass region= a mask of them, e.g. "
                "model(x).logits.argmax(1) == cls (resized to the image)."
            )
        return [("mask", region_of(region.mask, image))]
    if isinstance(region, DepthDifference):
        return [(name, region_of(part.mask, image))
                for name, part in (("near", region.first), ("far", region.second))]  # fmt: skip
    if isinstance(region, Pixel):
        if region.size is None:
            raise ValueError(
                f"{region!r} names a pixel of the model's output grid, whose size the figure "
                "does not know: give the target size=(H, W), the image's, to outline it."
            )
        if region.y >= region.size[0] or region.x >= region.size[1]:
            raise ValueError(f"{region!r} lies outside its {region.size} image.")
        mask = torch.zeros(region.size, dtype=torch.bool)
        mask[region.y, region.x] = True
        return [("pixel", mask.numpy())]
    raise TypeError(
        f"region must be a mask (H, W) or (B, H, W), or a dense target of vk.targets "
        f"(segment(cls, mask), depth_region, depth_difference, pixel); got "
        f"{type(region).__name__}."
    )


def region_label(region: Region, image: int = 0) -> str:
    """What ``region`` is and how it is outlined, for a title: "explains class 1 over the mask;
    outlined (red): the mask", or for a plain mask "outlined (red): the region"."""
    names = [name for name, _ in target_regions(region, image)]
    if len(names) == 1:
        lines = f"outlined ({LINE_NAMES[0]}): the {names[0]}"
    else:
        lines = "outlined: " + ", ".join(f"{n} ({c})" for n, c in zip(names, LINE_NAMES,
                                                                      strict=False))  # fmt: skip
    label = getattr(region, "label", None)
    return f"explains {label}; {lines}" if label else lines


def contour(mask: np.ndarray, size: tuple[int, int]) -> tuple[list, list]:
    """The contour of ``mask`` (h, w) bool over an image of ``size`` (H, W) whose pixels are
    the axes: the edges between pixels in and out of it (and the image's border), joined into
    runs, as x and y lists with None between the segments (a plotly line). A mask of another
    size than the image's is stretched over it."""
    rows, cols = mask.shape
    sy, sx = size[0] / rows, size[1] / cols
    padded = np.pad(mask.astype(bool), 1)
    xs: list = []
    ys: list = []
    # vertical edges: between columns j - 1 and j of the mask, over runs of rows
    for j, edges in enumerate((padded[1:-1, 1:] != padded[1:-1, :-1]).T):
        for start, stop in _runs(edges):
            xs += [j * sx - 0.5] * 2 + [None]
            ys += [start * sy - 0.5, stop * sy - 0.5, None]
    # horizontal edges: between rows i - 1 and i, over runs of columns
    for i, edges in enumerate(padded[1:, 1:-1] != padded[:-1, 1:-1]):
        for start, stop in _runs(edges):
            xs += [start * sx - 0.5, stop * sx - 0.5, None]
            ys += [i * sy - 0.5] * 2 + [None]
    return xs, ys


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of True in a 1-D bool array."""
    steps = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(steps == 1).tolist(), np.flatnonzero(steps == -1).tolist(),
                    strict=True))  # fmt: skip


def outline_regions(
    fig: go.Figure, region: Region, image: int, size: tuple[int, int], **subplot
) -> go.Figure:
    """Draw the contour of each of ``region``'s regions on image ``image`` (`target_regions`)
    over an image of ``size`` (H, W) whose pixels are the axes; ``subplot``: its row and col."""
    for (name, mask), (colour, dash) in zip(target_regions(region, image), LINES, strict=False):
        xs, ys = contour(mask, size)
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", name=name, showlegend=False,
                       line={"color": colour, "width": 2, "dash": dash}, hoverinfo="skip"),
            **subplot,
        )  # fmt: skip
    return fig
