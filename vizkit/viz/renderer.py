"""Which plotly renderer notebooks use, so that figures survive export to HTML."""

from __future__ import annotations

import plotly.io as pio

__all__ = ["EXPORTABLE_RENDERER", "use_exportable_figures"]

# plotly's own mimetype (drawn by JupyterLab) plus an HTML copy whose plotly.js is embedded once,
# offline: nbconvert's HTML export, GitHub and other readers without JupyterLab show the latter
EXPORTABLE_RENDERER = "plotly_mimetype+notebook"


def use_exportable_figures() -> None:
    """Make every figure this kernel shows readable in an HTML export (``jupyter nbconvert --to
    html``) as well as in JupyterLab: plotly's default renderer draws only inside JupyterLab, so
    an exported notebook would have empty figures. Call once, at the top of a notebook."""
    pio.renderers.default = EXPORTABLE_RENDERER
