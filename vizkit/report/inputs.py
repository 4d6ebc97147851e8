"""What a report is about: the model (zoo, timm or checkpoint) and the images it looks at."""

from __future__ import annotations

import json
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
    model: str = DEFAULT_MODEL, data: str | None = None, n: int = 8, checkpoint: str | None = None
) -> ReportInputs:
    """Load the model and ``n`` images of ``data`` ("shapes", "digits" or an image folder;
    default: the zoo model's data set, else digits)."""
    if n < 1:
        raise ValueError(f"--n must be at least 1; got {n}.")
    net, card = _load_model(model, checkpoint)
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
    if not folder.exists():
        raise FileNotFoundError(
            f"--data {data!r} is neither 'shapes', 'digits' nor an existing image folder."
        )
    files = ImageFolder(folder, net)
    count = min(n, len(files))
    images = torch.stack([files[i][0] for i in range(count)])
    return ReportInputs(model, net, card, images, f"{count} images from {folder}", classes=classes)


def _load_model(model: str, checkpoint: str | None) -> tuple[nn.Module, dict]:
    """A zoo name, a timm name (with ``checkpoint``), or a .safetensors path with its card
    (``<stem>.json``, as the zoo writes them) beside it."""
    path = Path(model)
    if path.suffix == ".safetensors":
        card_file = path.with_suffix(".json")
        if not path.is_file() or not card_file.is_file():
            raise FileNotFoundError(
                f"{model}: a checkpoint path needs the file and its card {card_file.name} "
                "(architecture, kwargs) beside it; or pass --model <timm name> --checkpoint "
                f"{model}."
            )
        card = json.loads(card_file.read_text())
        kwargs = {
            **card.get("kwargs", {}),
            "pretrained_cfg_overlay": card.get("pretrained_cfg", {}),
        }
        net, _ = zoo.load(card["architecture"], checkpoint=path, **kwargs)
        return net, {**card, "weights": str(path)}
    return zoo.load(model, checkpoint=checkpoint)
