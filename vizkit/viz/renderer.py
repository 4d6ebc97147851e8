"""Which plotly renderer notebooks use, so that figures survive export to HTML."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import HtmlRenderer, MimetypeRenderer

__all__ = ["EXPORTABLE_RENDERER", "html_copy", "use_exportable_figures"]

# plotly's own mimetype (drawn by JupyterLab) plus an HTML copy whose plotly.js is embedded once,
# offline: nbconvert's HTML export, GitHub and other readers without JupyterLab show the latter
EXPORTABLE_RENDERER = "plotly_mimetype+notebook"


def use_exportable_figures() -> None:
    """Make every figure this kernel shows readable in an HTML export (``jupyter nbconvert --to
    html``) as well as in JupyterLab: plotly's default renderer draws only inside JupyterLab, so
    an exported notebook would have empty figures. Call once, at the top of a notebook."""
    pio.renderers.default = EXPORTABLE_RENDERER


def html_copy(fig: go.Figure) -> str | None:
    """``fig`` as HTML that draws with the page's plotly.js, for a kernel whose default renderer
    makes HTML (`use_exportable_figures`); None where it makes none (plotly's default).

    plotly.js comes into the page once per kernel, as for a figure shown in a cell: the first
    call activates the renderer (which displays the library), later ones only refer to it.
    ``fig._repr_mimebundle_()`` would activate it on every call: 4.8 MB per explorer redraw,
    into JupyterLab's log console from a widget callback. No MathJax loader either (plotly's
    HTML renderer adds one from a CDN, a failed request offline; vizkit's labels use none).
    """
    renderers = pio.renderers
    names = renderers.default.split("+") if renderers.default else []
    if not any(isinstance(renderers[name], HtmlRenderer) for name in names):
        return None
    renderers._activate_pending_renderers(cls=MimetypeRenderer)  # what pio.show does first
    return pio.to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False,
                       default_width="100%", validate=False)  # fmt: skip
