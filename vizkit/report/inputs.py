"""What a report is about: the model (zoo, timm or checkpoint) and the images it looks at."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .. import zoo
from ..datasets import DATA_SOURCES, Batch, model_batch
from ..hooks import HookedModel

__all__ = ["ReportInputs", "load_inputs"]

DEFAULT_MODEL = "vit_tiny_shapes"
CKA_IMAGES = 64  # the report's CKA batch, at least
MAX_IMAGES = 64


@dataclass
class ReportInputs:
    """Model and images of a report.

    Attributes:
        images: (B, C, H, W) normalized for the model; masks (B, H, W) bool when the data has
            them; labels (B,) the images' classes when they are the model's classes (the data
            is the model's own); classes: the names of the model's classes when known (as many
            as it has), else None (classes shown by index).
        cka_images: a larger batch (>= 32 images where the data has them) for CKA.
        class_note: why the data's labels or class names are not used ("" when they are).
        progress: whether long sections show progress bars.
        hooked: the model wrapped once, for every section.
        sae: the folder of a sparse autoencoder of this model (`vk.train_sae(...,
            checkpoint=folder)`) for the features section, or None.
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
    class_note: str = ""
    progress: bool = True
    sae: str | None = None
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
            f"--n must be 1..{MAX_IMAGES} (the report shows every image in its galleries); got {n}."
        )
    net, card = zoo.load(model, checkpoint=checkpoint)
    net = net.to(device)
    batch = model_batch(net, data, n, card)
    folder = data is not None and data not in DATA_SOURCES
    cka = batch if folder or n >= CKA_IMAGES else model_batch(net, data, CKA_IMAGES, card)
    labels, classes, note = _model_classes(net, card, data, batch)
    return ReportInputs(
        model, net, card, batch.images, batch.source, labels, batch.masks, classes, cka.images,
        note,
    )  # fmt: skip


def _model_classes(
    net: nn.Module, card: dict, data: str | None, batch: Batch
) -> tuple[Tensor | None, list[str] | None, str]:
    """The batch's labels and the class names, kept only where they are the model's: the labels
    when the data is the one the model was trained on, the names when there is one per output
    class; and a note saying what was dropped and why."""
    trained_on = card.get("data", {}).get("name")
    source = data or trained_on or "digits"  # as model_batch resolves it
    own = source == trained_on
    count = _class_count(net, batch.images)
    notes = []
    labels = batch.labels if own else None
    if batch.labels is not None and labels is None:
        notes.append(
            f"the images' labels are classes of {source}, not of this model's {count} classes, "
            "so predictions are not marked right or wrong"
        )
    classes = batch.classes if own else card.get("classes")
    if classes is not None and len(classes) != count:
        notes.append(
            f"the {len(classes)} class names do not fit the model's {count} classes, so "
            "classes are shown by index"
        )
        classes = None
    return labels, classes, "; ".join(notes)


def _class_count(net: nn.Module, images: Tensor) -> int:
    """How many classes the model predicts: timm's ``num_classes``, else its output's width."""
    count = getattr(net, "num_classes", None)
    if isinstance(count, int) and count > 0:
        return count
    device = next(net.parameters()).device
    with torch.no_grad():
        return int(net(images[:1].to(device)).shape[-1])
