"""What a map explains on a dense output: a segmentation model's per-pixel class logits
(B, K, h, w) or a depth model's per-pixel depth (B, h, w) hold no single class score, so each
helper here names one (`vizkit.targets` exports them), following the target contract: a score
per image, summed by every method.

- `segment`: a class's logits summed over a mask (pytorch-grad-cam's
  ``SemanticSegmentationTarget``), or over the pixels the class wins (the aggregation captum's
  segmentation tutorial uses);
- `pixel`: one pixel's class logit;
- `depth_region`, `depth_difference`: the mean predicted depth over a region, and the
  difference between two regions' means;
- `mask_logit`: one predicted mask's logits of a promptable mask model (SAM or SAM 2, given its
  prompt by `vizkit.models.prompted_masks`), summed over a region or over the mask itself.

The masks and coordinates are in the output's own pixels, or, where the output is smaller or
larger than the mask (SegFormer's logits at 1/4 of the image, DPT's depth at twice it), the
output is resized bilinearly to the mask's size first, as transformers' post-processing resizes
it to the image. ``box_mask`` makes a mask of a box.

>>> import torch, vizkit as vk
>>> logits = torch.zeros(1, 3, 4, 4); logits[0, 2, :2] = 1.0
>>> vk.targets.segment(2)(logits)  # the 8 pixels class 2 wins
tensor([8.])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..hooks.inputs import check_count
from ..hooks.scores import ScoreTarget
from .embeddings import _check_box  # one box check for every target

__all__ = [
    "DepthDifference",
    "DepthRegion",
    "MaskLogit",
    "Pixel",
    "Segment",
    "box_mask",
    "dense_logits",
    "depth_difference",
    "depth_of",
    "depth_region",
    "mask_logit",
    "masks_of",
    "pixel",
    "query_class_scores",
    "segment",
]


def _field(output: object, name: str) -> object:
    return output.get(name) if isinstance(output, dict) else getattr(output, name, None)


def _described(found: object, output: object) -> object:
    """What a dense target found: its shape, or the type of the output it was looked for in
    (a transformers output without that field holds None there)."""
    if isinstance(found, Tensor):
        return tuple(found.shape)
    return type(output if found is None else found).__name__


def query_class_scores(output: object) -> Tensor | None:
    """(B, K, h, w) per-pixel class scores of a mask-classification model (Mask2Former, Cheng
    et al. 2022, "Masked-attention Mask Transformer for Universal Image Segmentation", Sec. 3;
    MaskFormer): each query's class probabilities (its "no object" class dropped) times its
    mask's sigmoid, summed over the queries, as transformers'
    ``post_process_semantic_segmentation`` computes them before its argmax; None for another
    output."""
    classes, masks = _field(output, "class_queries_logits"), _field(output, "masks_queries_logits")
    if not (isinstance(classes, Tensor) and isinstance(masks, Tensor)):
        return None
    return torch.einsum("bqk,bqhw->bkhw", classes.softmax(-1)[..., :-1], masks.sigmoid())


def dense_logits(output: object) -> Tensor:
    """(B, K, h, w) per-pixel class logits of a segmentation model's output: a tensor itself,
    the ``logits`` of a transformers ``SemanticSegmenterOutput`` (or a dict), or a
    mask-classification model's per-pixel class scores (`query_class_scores`)."""
    scores = query_class_scores(output)
    if scores is not None:
        return scores
    found = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", output)
    if not isinstance(found, Tensor) or found.ndim != 4:
        shape = _described(found, output)
        raise ValueError(
            f"A segmentation target needs per-pixel class logits (B, K, h, w); the model gave "
            f"{shape}. A depth model's output takes vk.targets.depth_region(mask)."
        )
    return found


def depth_of(output: object) -> Tensor:
    """(B, h, w) the per-pixel depth of a depth model's output: a (B, h, w) or (B, 1, h, w)
    tensor itself, or the ``predicted_depth`` of a transformers ``DepthEstimatorOutput``."""
    found = output.get("predicted_depth") if isinstance(output, dict) else getattr(
        output, "predicted_depth", output
    )  # fmt: skip
    if isinstance(found, Tensor) and found.ndim == 4 and found.shape[1] == 1:
        found = found[:, 0]
    if not isinstance(found, Tensor) or found.ndim != 3:
        shape = _described(found, output)
        raise ValueError(
            f"A depth target needs a per-pixel depth (B, h, w); the model gave {shape}. A "
            "segmentation model's output takes vk.targets.segment(class, mask)."
        )
    return found


def masks_of(output: object) -> Tensor:
    """(B, P, M, h, w) mask logits of a promptable mask model's output (P prompts, M masks
    each): the ``pred_masks`` of transformers' SAM / SAM 2 output (or a dict); a
    mask-classification model's query masks ``masks_queries_logits`` (B, Q, h, w) as one
    "prompt" of Q masks (mask q: query q's)."""
    found = _field(output, "pred_masks")
    queries = _field(output, "masks_queries_logits")
    if found is None and isinstance(queries, Tensor):
        found = queries[:, None]
    if not isinstance(found, Tensor) or found.ndim != 5:
        shape = _described(found, output)
        raise ValueError(
            f"A mask target needs a promptable mask model's pred_masks (B, P, M, h, w); the "
            f"model gave {shape}. Give SAM its prompt with vk.models.prompted_masks(model, "
            "points=...); a segmentation model's output takes vk.targets.segment(class, mask)."
        )
    return found


def box_mask(box: tuple[int, int, int, int], size: tuple[int, int]) -> Tensor:
    """(H, W) bool: the pixels of ``box`` = (top, left, height, width) in an image of ``size``
    (H, W)."""
    height, width = (check_count("size", s) for s in size)
    top, left, rows, cols = _check_box(box, height, width)
    mask = torch.zeros(height, width, dtype=torch.bool)
    mask[top : top + rows, left : left + cols] = True
    return mask


def _check_mask(name: str, mask: object) -> Tensor:
    """``mask`` as a float (H, W) or (B, H, W) weight map, refused when empty."""
    if not isinstance(mask, Tensor) or mask.ndim not in (2, 3):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a (H, W) or (B, H, W) tensor; got {shape}.")
    if mask.is_floating_point() and not bool(torch.isfinite(mask).all()):
        raise ValueError(f"{name} holds NaN or Inf values.")
    weights = mask.float()
    empty = (weights.flatten(-2) == 0).all(-1)
    if bool(empty.any()):
        raise ValueError(
            f"{name} selects no pixel (of images {empty.nonzero().flatten().tolist()})."
        )
    return weights


def _at(values: Tensor, size: tuple[int, int]) -> Tensor:
    """``values`` (B, [K,] h, w) at (H, W) = ``size``: bilinear where the sizes differ."""
    if tuple(values.shape[-2:]) == tuple(size):
        return values
    grid = values if values.ndim == 4 else values[:, None]
    resized = F.interpolate(grid.float(), size=size, mode="bilinear", align_corners=False)
    return resized if values.ndim == 4 else resized[:, 0]


def _rows_of(weights: Tensor, rows: Tensor | int | None, count: int) -> Tensor:
    """The mask of each of ``count`` rows: the same (H, W) for all, or image ``rows[i]``'s."""
    if weights.ndim == 2:
        return weights.expand(count, *weights.shape)
    if rows is None:
        if len(weights) != count:
            raise ValueError(
                f"{len(weights)} masks for a batch of {count} images; give one (H, W) mask for "
                "all or one per image (B, H, W)."
            )
        return weights
    if isinstance(rows, int):  # copies of one image
        return weights[rows].expand(count, *weights.shape[1:])
    return weights[torch.as_tensor(rows).cpu()]


def _class_index(name: str, value: object) -> int:
    return check_count(name, value, minimum=0)


class Segment(ScoreTarget):
    """A class's logits summed over a mask (weights), or over the pixels the class wins."""

    def __init__(self, cls: int, mask: Tensor | None) -> None:
        self.cls = _class_index("class", cls)
        self.mask = None if mask is None else _check_mask("mask", mask)
        self.per_image = self.mask is not None and self.mask.ndim == 3
        self.label = f"class {self.cls} " + (
            "over the mask" if mask is not None else "where it wins"
        )

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        logits = dense_logits(output)
        if self.cls >= logits.shape[1]:
            raise ValueError(f"class {self.cls} is out of range: the output has {logits.shape[1]}.")
        if self.mask is None:  # the pixels the class wins, held constant
            wins = (logits.detach().argmax(1) == self.cls).to(logits.dtype)
            return (logits[:, self.cls] * wins).flatten(1).sum(1)
        mask = _rows_of(self.mask, rows, len(logits)).to(logits.device)
        scores = _at(logits[:, self.cls : self.cls + 1], tuple(mask.shape[-2:]))[:, 0]
        return (scores * mask).flatten(1).sum(1)


class Pixel(ScoreTarget):
    """One pixel's class logit."""

    def __init__(self, cls: int, y: int, x: int, size: tuple[int, int] | None) -> None:
        self.cls, self.y, self.x = (_class_index(n, v) for n, v in (("class", cls), ("y", y),
                                                                    ("x", x)))  # fmt: skip
        self.size = None if size is None else tuple(check_count("size", s) for s in size)
        self.label = f"class {self.cls} at ({self.y}, {self.x})"

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        logits = dense_logits(output)
        if self.cls >= logits.shape[1]:
            raise ValueError(f"class {self.cls} is out of range: the output has {logits.shape[1]}.")
        grid = _at(logits[:, self.cls : self.cls + 1], self.size or tuple(logits.shape[-2:]))
        height, width = grid.shape[-2:]
        if self.y >= height or self.x >= width:
            raise ValueError(
                f"Pixel ({self.y}, {self.x}) is outside the {height} x {width} output; give "
                "size=(H, W) for coordinates in the image's pixels."
            )
        return grid[:, 0, self.y, self.x]


class DepthRegion(ScoreTarget):
    """The mean predicted depth over a mask (weights)."""

    label = "mean depth over the mask"

    def __init__(self, mask: Tensor) -> None:
        self.mask = _check_mask("mask", mask)
        self.per_image = self.mask.ndim == 3

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        depth = depth_of(output)
        mask = _rows_of(self.mask, rows, len(depth)).to(depth.device)
        values = _at(depth, tuple(mask.shape[-2:]))
        return (values * mask).flatten(1).sum(1) / mask.flatten(1).sum(1)


class DepthDifference(ScoreTarget):
    """The mean predicted depth over one mask less that over another."""

    label = "depth difference of two regions"

    def __init__(self, near: Tensor, far: Tensor) -> None:
        self.first, self.second = DepthRegion(near), DepthRegion(far)
        self.per_image = self.first.per_image or self.second.per_image

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        return self.first(output, rows) - self.second(output, rows)


class MaskLogit(ScoreTarget):
    """One predicted mask's logits summed over a region (weights), or over the mask itself."""

    def __init__(self, mask: int, region: Tensor | None, prompt: int) -> None:
        self.mask, self.prompt = _class_index("mask", mask), _class_index("prompt", prompt)
        self.region = None if region is None else _check_mask("region", region)
        self.per_image = self.region is not None and self.region.ndim == 3
        self.label = f"mask {self.mask} of prompt {self.prompt} " + (
            "over the region" if region is not None else "where it is predicted"
        )

    def __call__(self, output: object, rows: Tensor | int | None = None) -> Tensor:
        masks = masks_of(output)
        prompts, count = masks.shape[1:3]
        if self.prompt >= prompts or self.mask >= count:
            raise ValueError(
                f"mask {self.mask} of prompt {self.prompt} is out of range: the model gave "
                f"{prompts} prompt(s) of {count} mask(s) (multimask_output=True gives 3)."
            )
        logits = masks[:, self.prompt, self.mask]  # (B, h, w)
        if self.region is None:  # the pixels the mask covers (logit > 0), held constant
            return (logits * (logits.detach() > 0).to(logits.dtype)).flatten(1).sum(1)
        region = _rows_of(self.region, rows, len(logits)).to(logits.device)
        return (_at(logits, tuple(region.shape[-2:])) * region).flatten(1).sum(1)


def segment(cls: int, mask: Tensor | None = None) -> Segment:
    """Class ``cls``'s logits summed over ``mask`` ((H, W) for every image or (B, H, W) one per
    image; bool or weights), or with no mask over the pixels the class wins (the argmax of the
    output, held constant)."""
    return Segment(cls, mask)


def pixel(cls: int, y: int, x: int, size: tuple[int, int] | None = None) -> Pixel:
    """Class ``cls``'s logit at pixel (``y``, ``x``): of the output's own grid, or of an image
    of ``size`` (H, W), the logits resized to it bilinearly."""
    return Pixel(cls, y, x, size)


def depth_region(mask: Tensor) -> DepthRegion:
    """The mean predicted depth over ``mask`` ((H, W) or (B, H, W); bool or weights)."""
    return DepthRegion(mask)


def mask_logit(mask: int = 0, region: Tensor | None = None, prompt: int = 0) -> MaskLogit:
    """Predicted mask ``mask`` of prompt ``prompt`` of a promptable mask model (SAM, SAM 2 with its
    prompt fixed by `vizkit.models.prompted_masks`): its logits summed over ``region`` ((H, W)
    or (B, H, W); bool or weights; the low-resolution logits resized to it bilinearly), or with
    no region over the pixels it covers (logit > 0, held constant)."""
    return MaskLogit(mask, region, prompt)


def depth_difference(near: Tensor, far: Tensor) -> DepthDifference:
    """The mean predicted depth over ``near`` less that over ``far`` (masks as `depth_region`):
    what makes one region read as farther (larger depth) than the other."""
    return DepthDifference(near, far)
