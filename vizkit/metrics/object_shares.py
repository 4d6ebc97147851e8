"""The share of a map explaining an object's class that lies on the object: the planted
question of a segmentation model on data with one object per image (the Shapes masks,
`vizkit.datasets.ShapeMasks`), where the object's pixels are the only ones of its class."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..methods.registry import registered
from ..targets.dense import segment
from .localization import check_masks, energy_in_mask

__all__ = ["mask_shares"]


def mask_shares(
    model: nn.Module, images: Tensor, masks: Tensor, classes: Tensor, method: str = "gradcam",
    over: Tensor | None = None, **options,
) -> Tensor:  # fmt: skip
    """(B,) the share of each image's map that lies on its shape (`vizkit.metrics.energy_in_mask`
    of ``masks`` (B, H, W) bool): the map of saliency method ``method`` (a name of
    `vizkit.methods.METHODS`, with its ``options``) explaining the image's own class
    ``classes`` (B,) (pixel classes, 1..10) as ``vk.targets.segment(class, over)``, the class's
    logits summed over ``over`` (B, H, W) (default: the whole image). A segment target names one
    class, so the images go class by class. ``images`` (B, 3, H, W) as the model takes them."""
    masks = check_masks(masks)
    classes = torch.as_tensor(classes)
    over = torch.ones_like(masks) if over is None else over
    if not (len(images) == len(classes) == len(over) == len(masks)):
        raise ValueError(
            f"images, masks, classes and over must hold one entry per image; got "
            f"{len(images)}, {len(masks)}, {len(classes)} and {len(over)}."
        )
    shares = torch.empty(len(images))
    run = registered(method)
    for cls in classes.unique().tolist():
        rows = (classes == cls).nonzero()[:, 0]
        result = run(model, images[rows], target=segment(cls, over[rows]), **options)
        shares[rows] = energy_in_mask(result, masks[rows]).cpu()
    return shares
