"""The Shapes probe set for Network Dissection: test images as the shipped Shapes ViT takes
them, and the concept masks the generator gives per pixel."""

from __future__ import annotations

import torch
from torch import Tensor

from ..datasets.shapes import SHAPE_CLASSES, Shapes
from ..hooks.inputs import check_count
from .dissection import Concepts

__all__ = ["SHAPES_CONCEPTS", "shapes_concepts"]

SHAPES_CONCEPTS = (*SHAPE_CLASSES, "object", "background", "dark object", "bright object")


def shapes_concepts(
    n: int, split: str = "test", seed: int = 0, size: int = 32
) -> tuple[Tensor, Concepts]:
    """``n`` Shapes images and their concepts (`SHAPES_CONCEPTS`).

    Each shape class's concept is the object mask of the images of that class; "object" is
    every image's object mask and "background" the rest (distractors included: the generator
    gives no mask of them). The object's tone is an attribute of the image, not a mask: "dark
    object" is the object mask of the images whose object is dark (drawn on a light
    background), "bright object" of the others.

    Returns:
        images (n, 3, size, size) float32 normalized as `vizkit.datasets.Shapes` gives them,
        and `Concepts` (n, 14, size, size).
    """
    shapes = Shapes(split, n=check_count("n", n), size=size, seed=seed)
    images = torch.stack([shapes[i][0] for i in range(n)])
    objects = shapes.masks  # (n, H, W)
    per_class = [objects & (shapes.labels == c)[:, None, None] for c in range(len(SHAPE_CLASSES))]
    dark = _dark_objects(shapes.images, objects)[:, None, None]
    masks = [*per_class, objects, ~objects, objects & dark, objects & ~dark]
    return images, Concepts(list(SHAPES_CONCEPTS), torch.stack(masks, 1))


def _dark_objects(images: Tensor, objects: Tensor) -> Tensor:
    """(n,) bool: whether each image's object is dark, its mean value over its pixels and
    channels below the middle of (0, 255) (the generator draws objects dark, in [0, 0.3], on
    light backgrounds and bright, in [0.7, 1], on dark ones)."""
    area = objects.flatten(1).sum(1).clamp_min(1)
    total = (images.float().mean(1) * objects).flatten(1).sum(1)
    return total / area < 127.5
