"""The Shapes probe set for Network Dissection: test images as the shipped Shapes ViT takes
them, and the concept masks the generator gives per pixel. Beside it, what else the generator
knows of an image: its class, against which a unit's name is checked (`truth_units`), and its
background's stripes, a concept for TCAV (`background_contrast`, `striped_scenes`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..datasets.shapes import SHAPE_CLASSES, Shapes, counterfactual_shapes, render_shapes
from ..hooks import HookedModel
from ..hooks.contract import analysis_contract
from ..hooks.inputs import check_count
from ..sae.autoencoder import SparseAutoencoder
from .dissection import Concepts
from .held_out import concept_presence, image_auc, image_maxima
from .probe_set import probe_set
from .units import read_units

__all__ = [
    "IQR_PER_STD", "SHAPES_CONCEPTS", "background_contrast", "shapes_concepts", "striped_scenes",
    "truth_units",
]  # fmt: skip

SHAPES_CONCEPTS = (
    *SHAPE_CLASSES, "object", "background", "dark object", "bright object", "distractor",
    "small object", "large object", "object on the left", "object on the right",
    "object at the top", "object at the bottom", "red-tinted object", "green-tinted object",
    "blue-tinted object",
)  # fmt: skip
MIDDLE_SCALE = 0.55  # the middle of the generator's object scales, 0.45 to 0.65
IQR_PER_STD = 1.349  # a normal distribution's interquartile range, in standard deviations


def shapes_concepts(
    n: int, split: str = "test", seed: int = 0, size: int = 32
) -> tuple[Tensor, Concepts]:
    """``n`` Shapes images and their concepts (`SHAPES_CONCEPTS`).

    Each shape class's concept is the object mask of the images of that class; "object" is
    every image's object mask and "background" the rest (distractors included); "distractor"
    the line segments' and dots' pixels. The object's other attributes, as the generator drew
    them (`vizkit.datasets.shapes.render_shapes` with ``details``), are concepts over its mask
    in the images that have them: its tone ("dark object": drawn dark on a light background,
    "bright object"), its size (below or above `MIDDLE_SCALE`), its position (its centre left
    or right of the middle, above or below it) and its tint (the strongest channel of the RGB
    mix its colour is drawn from).

    Returns:
        images (n, 3, size, size) float32 normalized as `vizkit.datasets.Shapes` gives them,
        and `Concepts` (n, 24, size, size), in `SHAPES_CONCEPTS` order.
    """
    shapes = Shapes(split, n=check_count("n", n), size=size, seed=seed)
    images = torch.stack([shapes[i][0] for i in range(n)])
    objects = shapes.masks  # (n, H, W)
    per_class = [objects & (shapes.labels == c)[:, None, None] for c in range(len(SHAPE_CLASSES))]
    dark = _dark_objects(shapes.images, objects)[:, None, None]
    drawn = render_shapes(n, size, seed, split, details=True)[3]
    scale, centre = torch.from_numpy(drawn["scale"]), torch.from_numpy(drawn["centre"])
    tint = torch.from_numpy(drawn["hue"]).argmax(1)
    attributes = [scale < MIDDLE_SCALE, scale >= MIDDLE_SCALE, centre[:, 0] < 0,
                  centre[:, 0] >= 0, centre[:, 1] < 0, centre[:, 1] >= 0,
                  *(tint == c for c in range(3))]  # fmt: skip
    masks = [*per_class, objects, ~objects, objects & dark, objects & ~dark,
             torch.from_numpy(drawn["distractors"]),
             *(objects & held[:, None, None] for held in attributes)]  # fmt: skip
    return images, Concepts(list(SHAPES_CONCEPTS), torch.stack(masks, 1))


def _dark_objects(images: Tensor, objects: Tensor) -> Tensor:
    """(n,) bool: whether each image's object is dark, its mean value over its pixels and
    channels below the middle of (0, 255) (the generator draws objects dark, in [0, 0.3], on
    light backgrounds and bright, in [0.7, 1], on dark ones)."""
    area = objects.flatten(1).sum(1).clamp_min(1)
    total = (images.float().mean(1) * objects).flatten(1).sum(1)
    return total / area < 127.5


@analysis_contract
def truth_units(
    model: nn.Module | HookedModel,
    units: str | SparseAutoencoder,
    images: Tensor,
    concepts: Concepts,
    *,
    batch_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """The generator's truth a unit's name is checked against: for each shape class, the unit
    whose largest activation over an image's patches best tells the images of that class from
    the others (ROC AUC, `vizkit.concepts.image_auc`), as benchmarks/concept_names_shapes.py
    measures it.

    Args:
        units: a hook name of a token stream (each channel a unit) or a
            `vizkit.sae.SparseAutoencoder` of this model (each latent a unit).
        images: (N, C, H, W) Shapes images normalized for the model, e.g. held-out ones.
        concepts: their `shapes_concepts` (the class masks say which image is of which class).

    Returns:
        (10,) int64 each class's unit (in `SHAPE_CLASSES` order) and (10,) float32 its AUC.
    """
    batch_size = check_count("batch_size", batch_size)
    if not isinstance(concepts, Concepts) or len(concepts.masks) != len(images):
        got = len(concepts.masks) if isinstance(concepts, Concepts) else type(concepts).__name__
        raise ValueError(
            f"concepts must be the Concepts of the {len(images)} images (shapes_concepts); "
            f"got {got}."
        )
    present = concept_presence(concepts, list(SHAPE_CLASSES))  # (N, 10) bool
    found = read_units(model, units, tuple(images.shape[-2:]), images[:1])
    auc = image_auc(image_maxima(found, probe_set(images, batch_size, "truth_units")), present)
    best = auc.nan_to_num(-1.0).max(1)
    return best.indices, best.values.float()


def background_contrast(images: Tensor, masks: Tensor | None = None) -> Tensor:
    """(n,) float32 how much each image's background varies: the interquartile range of each
    channel's values over the pixels outside ``masks`` (n, H, W) bool (None: every pixel),
    over `IQR_PER_STD` (a standard deviation, were they normal), root mean square over the
    channels.

    A Shapes background is a base colour, two sinusoidal gratings of random contrast, and pixel
    noise of the same spread in every image: this orders the images by how strongly their
    gratings stripe them (on 400 test scenes its rank correlation with the gratings' own
    standard deviation is about 0.97); the quartiles leave out most of the distractors' few
    pixels. ``images`` (n, C, H, W) in any units one affine map gives every channel (the
    generator's uint8, [0, 1], normalized): the order is the same.
    """
    if not isinstance(images, Tensor) or images.ndim != 4 or len(images) == 0:
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be (n, C, H, W) with n >= 1; got {got}.")
    values = images.float().flatten(2)  # (n, C, HW)
    if masks is not None:
        if not isinstance(masks, Tensor) or masks.dtype != torch.bool:
            raise TypeError("masks must be a bool tensor (n, H, W) of the objects' pixels.")
        if masks.shape != (len(images), *images.shape[-2:]):
            raise ValueError(
                f"masks must be {(len(images), *images.shape[-2:])}, one per image; got "
                f"{tuple(masks.shape)}."
            )
        if bool(masks.flatten(1).all(1).any()):
            raise ValueError("An image's mask covers every pixel: it has no background.")
        values = values.masked_fill(masks.flatten(1)[:, None], float("nan"))
    quartiles = torch.nanquantile(values, torch.tensor([0.25, 0.75]), dim=2)  # (2, n, C)
    spread = (quartiles[1] - quartiles[0]) / IQR_PER_STD
    return spread.pow(2).mean(1).sqrt()


def striped_scenes(
    n: int, count: int, split: str = "test", seed: int = 0, size: int = 32
) -> tuple[Tensor, Tensor]:
    """Shapes scenes without their objects, split by their stripes: a concept for TCAV.

    The ``n`` images of `vizkit.datasets.Shapes` (``split``, ``seed``, ``size``) rendered with
    their objects removed (`vizkit.datasets.counterfactual_shapes`, ``replace="none"``: the
    background and distractors where the object was), ordered by `background_contrast`.

    Returns:
        (count, 3, H, W) the ``count`` scenes of strongest gratings, strongest first ("striped
        background"), and (n - count, 3, H, W) the others in the generator's order (random
        draws of one distribution: random sets for TCAV), both normalized as `Shapes` gives
        them.
    """
    n, count = check_count("n", n), check_count("count", count)
    if count >= n:
        raise ValueError(f"count must be below n={n}, leaving scenes to draw random sets from; "
                         f"got {count}.")  # fmt: skip
    _, scenes, _, _ = counterfactual_shapes(n, size=size, seed=seed, split=split, replace="none")
    order = background_contrast(scenes).argsort(descending=True, stable=True)
    others = order[count:].sort().values
    return scenes[order[:count]], scenes[others]
