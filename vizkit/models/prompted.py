"""A promptable mask model (SAM 2: Ravi et al. 2024, "SAM 2: Segment Anything in Images and
Videos"; SAM: Kirillov et al. 2023, "Segment Anything") with its prompt held fixed, so that it
maps images to masks as every analysis calls a model: ``model(x)``.

A map then explains one predicted mask's logits (`vizkit.targets.mask_logit`), with the same
points or boxes for every image of the batch: the methods that run copies of a batch (IG,
SmoothGrad, the metrics) give every copy the same prompt.

>>> import torch
>>> from torch import nn
>>> class Toy(nn.Module):  # a stand-in for transformers' Sam2Model
...     def forward(self, pixel_values, input_points=None, input_labels=None, input_boxes=None,
...                 multimask_output=True):
...         return {"pred_masks": pixel_values.mean(1)[:, None, None]}
>>> prompted = prompted_masks(Toy(), points=[[10, 20]])
>>> prompted(torch.zeros(2, 3, 8, 8))["pred_masks"].shape
torch.Size([2, 1, 1, 8, 8])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["PromptedMasks", "prompted_masks"]


class PromptedMasks(nn.Module):
    """``model`` called on images with fixed prompts; returns the model's own output (its
    ``pred_masks`` (B, P, M, h, w): P prompts, M masks each, low-resolution logits).

    Attributes:
        model: the promptable model (transformers' ``Sam2Model``, ``SamModel``).
        points: (P, n, 2) point prompts (x, y) in the input image's pixels, or None.
        labels: (P, n) their labels (1 object, 0 background), or None.
        boxes: (P, 4) box prompts (x0, y0, x1, y1), or None.
        multimask_output: whether the model returns 3 candidate masks per prompt (else 1).
    """

    dense_output = True  # a map per image: explained through a target, never a class index

    def __init__(
        self, model: nn.Module, points: Tensor | None, labels: Tensor | None,
        boxes: Tensor | None, multimask_output: bool,
    ) -> None:  # fmt: skip
        super().__init__()
        self.model, self.multimask_output = model, multimask_output
        for name, value in (("points", points), ("labels", labels), ("boxes", boxes)):
            self.register_buffer(name, value, persistent=False)

    def forward(self, x: Tensor) -> object:
        """The model's output on images ``x`` (B, C, H, W), every image given the prompts."""
        prompts = {}
        for key, value in (("input_points", self.points), ("input_labels", self.labels),
                           ("input_boxes", self.boxes)):  # fmt: skip
            if value is not None:
                prompts[key] = value.expand(len(x), *value.shape)
        return self.model(pixel_values=x, multimask_output=self.multimask_output, **prompts)


def prompted_masks(
    model: nn.Module,
    points: Sequence | Tensor | None = None,
    labels: Sequence | Tensor | None = None,
    boxes: Sequence | Tensor | None = None,
    multimask_output: bool = False,
) -> PromptedMasks:
    """``model`` with fixed prompts, for the analyses (see `PromptedMasks`).

    Args:
        points: one prompt's points [[x, y], ...] (n, 2), or P prompts' (P, n, 2), in the
            input image's pixels (the model's processor coordinates).
        labels: the points' labels (n,) or (P, n); default 1 (object) for every point.
        boxes: one box [x0, y0, x1, y1] or P boxes (P, 4).
        multimask_output: 3 candidate masks per prompt instead of 1.

    Raises:
        ValueError: no prompt, or prompts of the wrong shape (the shapes they take are named).
    """
    if points is None and boxes is None:
        raise ValueError("Give the prompt: points=[[x, y], ...] and/or boxes=[x0, y0, x1, y1].")
    points_t = labels_t = boxes_t = None
    if points is not None:
        points_t = torch.as_tensor(points, dtype=torch.float32)
        points_t = points_t[None] if points_t.ndim == 2 else points_t
        if points_t.ndim != 3 or points_t.shape[-1] != 2:
            raise ValueError(
                f"points must be (n, 2) [[x, y], ...] or (P, n, 2); got {tuple(points_t.shape)}."
            )
        shape = points_t.shape[:2]
        labels_t = torch.ones(shape, dtype=torch.long) if labels is None else (
            torch.as_tensor(labels, dtype=torch.long).reshape(shape)
        )  # fmt: skip
    elif labels is not None:
        raise ValueError("labels label points; give points= with them.")
    if boxes is not None:
        boxes_t = torch.as_tensor(boxes, dtype=torch.float32)
        boxes_t = boxes_t[None] if boxes_t.ndim == 1 else boxes_t
        if boxes_t.ndim != 2 or boxes_t.shape[-1] != 4:
            raise ValueError(
                f"boxes must be [x0, y0, x1, y1] or (P, 4); got {tuple(boxes_t.shape)}."
            )
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    moved = [None if t is None else t.to(device) for t in (points_t, labels_t, boxes_t)]
    return PromptedMasks(model, *moved, multimask_output=bool(multimask_output)).eval()
