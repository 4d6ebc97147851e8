"""What a report is about: the model (zoo, timm or checkpoint) and the images it looks at."""

from __future__ import annotations

from dataclasses import dataclass, field
from torch import Tensor, nn

from .. import zoo
from ..hooks import HookedModel
from ..datasets import DATA_SOURCES, model_batch

__all__ = ["ReportInputs", "load_inputs"]

DEFAULT_MODEL = "vit_tiny_shapes"
CKA_IMAGES = 64  # the report's CKA batch, at least
MAX_IMAGES = 64


@dataclass
class ReportInputs:
    """Model and images of a report.

    Attributes:
        images: (B, C, H, W) normalized for the model; labels (B,) and masks (B, H, W) bool
            when the data has them; classes: class names when known.
        cka_images: a larger batch (>= 32 images where the data has them) for CKA.
        hooked: the model wrapped once, for every section.
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
    hooked: HookedModel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.hooked = HookedModel(self.model)  # one wrapper for every section


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
    if not 1 <= n <= MAX_IMAGES:
        raise ValueError(
            f"--n must be 1..{MAX_IMAGES} (the report shows every image in its galleries); "
            f"got {n}."
        )
    net, card = zoo.load(model, checkpoint=checkpoint)
    net = net.to(device)
    batch = model_batch(net, data, n, card)
    folder = data is not None and data not in DATA_SOURCES
    cka = batch if folder or n >= CKA_IMAGES else model_batch(net, data, CKA_IMAGES, card)
    return ReportInputs(
        model, net, card, batch.images, batch.source, batch.labels, batch.masks, batch.classes,
        cka.images,
    )  # fmt: skip
