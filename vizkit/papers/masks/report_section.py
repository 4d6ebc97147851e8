"""The report's learned-masks section (GMM paper Fig. 3), added to `vizkit.report.SECTIONS`."""

from __future__ import annotations

from ...report.inputs import ReportInputs
from ...report.sections import NotApplicable, Section, add_section
from .analysis import learned_masks
from .figures import mask_layers_figure, radial_profiles_figure

__all__ = ["masks_section"]


def masks_section(r: ReportInputs) -> Section:
    try:
        learned = learned_masks(r.model)
    except ValueError as reason:
        raise NotApplicable("the model has no learned attention masks (ELM or GMM).") from reason
    grid = tuple(r.model.patch_embed.grid_size)
    title = "Learned masks, heads averaged (z-scored per layer; GMM paper Fig. 3)"
    figures = [
        mask_layers_figure({name: m.mean(0) for name, m in learned.items()}, grid, title),
        radial_profiles_figure(learned, grid),
    ]
    text = (
        "Each masked layer's multiplicative mask over the patch-patch scores, and below each "
        "query patch's row folded onto the patch grid; then the mean mask value against distance."
    )
    return Section("Learned attention masks", text, figures)


add_section("masks", masks_section)
