"""Which plotly renderer notebooks use, so that figures survive export to HTML."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

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
    """The HTML this kernel's plotly renderer makes of ``fig``, as it does for a figure shown in
    a cell (the first one embeds plotly.js, once); None where the renderer makes none (plotly's
    default in a kernel: `use_exportable_figures` adds it)."""
    return fig._repr_mimebundle_().get("text/html")
