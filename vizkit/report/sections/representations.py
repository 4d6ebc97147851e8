"""The representation sections: how similar the block outputs are to each other (minibatch
linear CKA and the feature-evolution curve) and how much each residual branch adds to the
stream (residual-norm ratios, with LayerScale where the model has it)."""

from __future__ import annotations

from ... import analysis, viz
from ..inputs import ReportInputs
from .base import NotApplicable, Section

__all__ = ["representations", "residual_ratios"]


def representations(r: ReportInputs) -> Section:
    data = r.cka_images if r.cka_images is not None else r.images
    if len(data) < 8:
        raise NotApplicable(f"CKA needs at least 8 images; the data has {len(data)}.")
    try:
        evolution = analysis.feature_evolution(
            r.hooked, data, batch_size=min(32, len(data)), progress=False
        )
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    return Section(
        "Representation similarity (CKA)",
        f"Minibatch linear CKA (unbiased HSIC) between every pair of block outputs over "
        f"{evolution.cka.options['examples']} images, and the Refiner paper's feature-evolution "
        "curve (Eq. 2).",
        [viz.cka_heatmap(evolution.cka), viz.feature_evolution_curves({r.name: evolution})],
    )


def residual_ratios(r: ReportInputs) -> Section:
    try:
        result = analysis.residual_ratios(r.hooked, r.images)
    except ValueError as error:
        raise NotApplicable(str(error)) from error
    figures = [viz.residual_ratio_curves(result)]
    layerscale = any(result.has_layerscale)
    if layerscale:
        figures.append(viz.residual_ratio_curves(result, scaled=False))
        figures.append(viz.layerscale_heatmap(analysis.layerscale(r.hooked)))
    which = "with and without LayerScale's λ" if layerscale else "(the model has no LayerScale)"
    return Section(
        "Residual-norm ratios",
        "How much each residual branch adds to the stream entering it, ‖branch‖ / ‖x‖ per "
        f"image (CaiT Fig. 4), {which}.",
        figures,
    )
