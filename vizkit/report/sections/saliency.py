"""The saliency section: the registry's default saliency methods side by side on the report's
images, scored by deletion and insertion AUC and, where the data has object masks, by how well
the maps find the object."""

from __future__ import annotations

import re

from ... import viz
from ...hooks.scores import is_backbone
from ...metrics import compare_saliency
from ...metrics.faithfulness import unit_count
from ...targets import embedding_norm
from ..inputs import ReportInputs
from .base import Section, has_self_attention, without_warnings
from .saliency_methods import IG_STEPS, report_methods

__all__ = ["CURVE_STEPS", "saliency"]

# steps of each deletion and insertion curve, the comparison's quick setting (with IG_STEPS;
# most of a ViT-S report's time is the comparison)
CURVE_STEPS = 8


def saliency(r: ReportInputs) -> Section:
    methods = report_methods(has_self_attention(r))
    units = unit_count(r.model, tuple(r.images.shape[-2:]), "patch")
    backbone = is_backbone(r.model)
    table = without_warnings(  # methods that do not apply are noted in the table
        lambda: compare_saliency(
            r.hooked, r.images, methods, r.masks, steps=min(CURVE_STEPS, units),
            progress=r.progress, target=embedding_norm() if backbone else None,
        )
    )  # fmt: skip
    explains = (
        " The model is a backbone (embeddings, no classes): every map explains the norm of "
        "each image's embedding (vk.targets.embedding_norm()), and the curves track that norm; "
        "vk.compare_saliency(..., target=vk.targets.similar_to(reference)) explains "
        "similarity instead."
        if backbone
        else ""
    )
    images = viz.display_images(r.images, r.model)
    shown = min(2, len(r.images))
    return Section(
        "Saliency methods compared",
        "The registry's default saliency methods (vizkit.methods.default_methods: Grad-CAM, "
        "AttnLRP, integrated gradients and, where the model has them, the attention-based "
        "maps) side by side, scored by "
        "deletion and insertion AUC (patch level) and, where the data has object masks, by the "
        "pointing game, the energy in the mask and the IoU of a mask-sized top region; the "
        f"table holds means over the {len(r.images)} images (its caption names what was left "
        f"out). For a quick report the curves have {table.options['steps']} steps and "
        f"integrated gradients {IG_STEPS}; vk.compare_saliency(..., steps=16 or 64) scores "
        "finer." + explains,
        [viz.saliency_side_by_side(table, images, i, r.classes) for i in range(shown)],
        html=_breakable(table._repr_html_()),
    )


def _breakable(markup: str) -> str:
    """``markup`` with a line-break opportunity after each underscore of its text, so that
    long names (``integrated_gradients``, ``energy_in_mask``) wrap in narrow windows."""
    return re.sub(r">([^<]+)<", lambda m: ">" + m[1].replace("_", "_<wbr>") + "<", markup)
