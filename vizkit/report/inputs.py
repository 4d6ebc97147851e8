"""What a report is about: the model (zoo, timm or checkpoint) and the images it looks at."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from timm.data import resolve_data_config
from torch import Tensor, nn

from .. import zoo
from ..datasets import SHAPE_CLASSES, ImageFolder, digit_images, load_sample

__all__ = ["ReportInputs", "load_inputs"]

DEFAULT_MODEL = "vit_tiny_shapes"
@dataclass
class ReportInputs:
    """Model and images of a report.

    Attributes:
        images: (B, C, H, W) normalized for the model; labels (B,) and masks (B, H, W) bool
            when the data has them; classes: class names when known.
        cka_images: a larger batch (>= 32 images where the data has them) for CKA.
    """

    name: str
    model: nn.Module
    card: dict
    images: Tensor
    source: str
    labels: Tensor | None = None
    masks: Tensor | None = None
    classes: list[str] | None = None
    cka_images: Tensor | None = field(default=None, repr=False)


def load_inputs(
    model: str = DEFAULT_MODEL,
    data: str | None = None,
    n: int = 8,
    checkpoint: str | None = None,
    device: str = "cpu",
) -> ReportInputs:
    """Load the model onto ``device`` and ``n`` images of ``data`` ("shapes", "digits" or an
    image folder; default: the zoo model's data set, else digits). Images stay on the CPU: the
    analyses move them to the model."""
    if n < 1:
        raise ValueError(f"--n must be at least 1; got {n}.")
    net, card = zoo.load(model, checkpoint=checkpoint)
    net = net.to(device)
    data = data or card.get("data", {}).get("name", "digits")
    classes = card.get("classes")
    if data == "shapes":
        images, labels, masks = load_sample()
        if n > len(images):
            raise ValueError(f"The Shapes sample holds {len(images)} images; asked for {n}.")
        return ReportInputs(
            model, net, card, images[:n], f"{n} images of the committed Shapes sample", labels[:n],
            masks[:n], classes or list(SHAPE_CLASSES), images,
        )  # fmt: skip
    if data == "digits":
        cfg = resolve_data_config({}, model=net)
        size = tuple(cfg["input_size"][1:])
        images, labels = digit_images(max(n, 64), size, cfg["mean"], cfg["std"])
        return ReportInputs(
            model, net, card, images[:n], f"{n} scikit-learn digits at {size[0]}x{size[1]}",
            labels[:n], None, classes, images,
        )  # fmt: skip
    folder = Path(data)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"--data {data!r} is neither 'shapes', 'digits' nor an existing image folder."
        )
    found = ImageFolder(folder, net, limit=n)  # skips unreadable files with a warning
    images = torch.stack([image for image, _ in found])
    source = f"{len(images)} images from {folder}"
    return ReportInputs(model, net, card, images, source, classes=classes)
