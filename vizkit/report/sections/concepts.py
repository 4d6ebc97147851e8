"""The concepts section: the sparse autoencoder given with ``--sae`` dissected against the
report images' object masks, one concept per class (Network Dissection), and the relevance of
each image's prediction through the latents that carry most of it (concept-conditional maps)."""

from __future__ import annotations

import html

import torch

from ... import viz
from ...concepts import Concepts, conditioned_maps, dissect, unit_names
from ..inputs import ReportInputs
from .base import NotApplicable, Section, require_classes

__all__ = ["concepts"]

QUANTILE = 0.02  # a unit's share of the few report images' pixels (Bau et al.: 0.005 of many)
SHOWN = 4  # latents mapped


def concepts(r: ReportInputs) -> Section:
    """Each latent's label by dissection against the images' class masks, and the images'
    relevance through the latents of most relevance."""
    if r.sae is None:
        raise NotApplicable(
            "no sparse autoencoder was given (vizkit report --sae FOLDER, the folder "
            "vk.train_sae(..., checkpoint=FOLDER) wrote)"
        )
    require_classes(r, "no class prediction to condition on")
    if r.masks is None or r.labels is None or r.classes is None:
        raise NotApplicable(
            "the data has no object masks with the model's classes (the Shapes data has them), "
            "so there are no concepts to dissect the latents against"
        )
    from ...sae import SparseAutoencoder

    sae = SparseAutoencoder.load(r.sae).to(next(r.model.parameters()).device)
    found = dissect(r.hooked, r.images, _class_concepts(r), sae, quantile=QUANTILE,
                    progress=False)  # fmt: skip
    names = unit_names(found)
    through = conditioned_maps(r.hooked, r.images, None, sae, method="attnlrp", top=SHOWN)
    figure = viz.conditioned_maps_figure(through, viz.display_images(r.images, r.model), names,
                                         rows=range(min(2, len(r.images))))  # fmt: skip
    return Section(
        "Concepts (sparse autoencoder)",
        f"Network Dissection of the latents of the autoencoder given with --sae against the "
        f"objects' masks, one concept per class (each latent's top {QUANTILE:.0%} of pixels "
        f"over these {len(r.images)} images; a latent detects the concept of highest IoU "
        f"above 0.04: {int(found.detectors.sum())} of {len(found.units)} do). The figure shows "
        "each image's AttnLRP relevance for its predicted class, and the part of it that "
        "flows through each of the latents carrying most of it (concept relevance "
        "propagation's conditioning; the latents and the rest add up to the whole). "
        "vk.concepts names latents on more images, with held-out checks.",
        [figure],
        _table(found),
    )


def _class_concepts(r: ReportInputs) -> Concepts:
    """A concept per class the images show (the object's mask where the image is of it) and
    the object."""
    shown = sorted(set(r.labels.tolist()))
    masks = torch.stack([r.masks & (r.labels == c)[:, None, None] for c in shown] + [r.masks], 1)
    return Concepts([r.classes[c] for c in shown] + ["object"], masks.bool())


def _table(found) -> str:
    """The eight latents of highest IoU: their label, IoU and whether they detect it."""
    rows = "".join(
        f"<tr><td>{html.escape(unit)}</td><td>{html.escape(label)}</td><td>{iou:.3f}</td>"
        f"<td>{'yes' if iou > found.options['threshold'] else 'no'}</td></tr>"
        for unit, label, iou in found.table(8)
    )
    head = "<tr><th>latent</th><th>label</th><th>IoU</th><th>detector</th></tr>"
    return f"<table>{head}{rows}</table>"
