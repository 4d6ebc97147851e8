"""The one update path of the explorers: a FigureWidget that every browser view draws afresh
after each change, exactly as plotly.js draws a new figure.

A FigureWidget sends each edit to the browser as a delta that plotly.js merges into what it
holds, and plotly.js writes values of its own into that (autoranged ranges, the colour range it
computed, the subplot domains that square cells and images shrink); its views apply deltas
without waiting for the previous one to draw (an image trace draws asynchronously). Patched
over the previous view, a new one kept the old view's subplot domains and colour range in the
browser while the kernel held the new ones. So `LivePlot.show` sends no delta: it replaces the
widget's synced state in one message and mounts the widget again in its box, and the new view
draws that state with ``Plotly.newPlot``. The widget model stays (a new FigureWidget would send
plotly's 5 MB widget bundle again). The figure is drawn at the output area's width, which a
`PageWidth` beside it measures in the page (plotly's view cannot: it draws before it is in the
page); colour ranges are made explicit (`explicit_ranges`) and the title wrapped to that width
and its text fitted to that width (`vizkit.viz.fit.fit_text`).
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

from ..viz.fit import fit_text
from .page_width import PageWidth

__all__ = ["LivePlot", "explicit_ranges"]

MIN_WIDTH = 360  # px: narrower output areas scroll the figure rather than crush it
PLOTLY_WIDTH = 700  # px: what plotly.js draws a figure of no width at, in no measured page


class LivePlot:
    """A FigureWidget (``figure``) in a box of its own (``box``, what an explorer displays),
    below a `PageWidth` (``page_width``): each figure is drawn at the width of the page's output
    area once a view has measured it; when that width changes, ``redraw()`` is called (the
    explorer's refresh, which shows its figure again and reconnects its click handlers)."""

    def __init__(self, redraw: Callable[[], None]) -> None:
        self.figure = go.FigureWidget()
        self.page_width = PageWidth()
        self.box = widgets.VBox([self.page_width, self.figure], layout={"width": "100%"})
        self.page_width.observe(lambda _: redraw(), "width")

    @property
    def width(self) -> int | None:
        """The px width `show` draws at: the page's (at least MIN_WIDTH), None before a view
        has measured it (plotly.js then draws at its default, PLOTLY_WIDTH)."""
        return max(self.page_width.width, MIN_WIDTH) if self.page_width.width else None

    def show(self, figure: go.Figure) -> None:
        """Make ``figure`` the widget's figure, in Python and in every view of the box."""
        figure = go.Figure(figure)
        if self.width:
            figure.layout.width = self.width
        explicit_ranges(fit_text(figure, figure.layout.width or PLOTLY_WIDTH))
        widget = self.figure
        with widget.hold_sync():  # only the final state is sent, not the edits' deltas
            with widget.batch_update():
                widget.data = []
                widget.add_traces(list(figure.data))
                widget.layout = figure.layout
            widget._widget_data = deepcopy(widget._data)
            widget._widget_layout = deepcopy(widget._layout_obj._props)
        height = widget.layout.height
        self.box.layout.min_height = f"{height}px" if height else None  # no jump while it mounts
        self.box.children = (self.page_width,)
        self.box.children = (self.page_width, widget)  # a new view, drawn afresh from the state


def explicit_ranges(figure: go.Figure) -> go.Figure:
    """Set ``zauto`` on every trace with a colour range and ``cauto`` on every colour axis:
    automatic where no limit is given; fixed where one is, the other then filled in from the
    data as plotly.js would (the z values' min or max)."""
    for trace in figure.data:
        if "zauto" in trace and not trace.coloraxis:
            _fix(trace, "z", [trace])
    for name in [k for k in figure.layout.to_plotly_json() if k.startswith("coloraxis")]:
        shown = [t for t in figure.data if t.to_plotly_json().get("coloraxis") == name]
        _fix(figure.layout[name], "c", shown)
    return figure


def _fix(holder, letter: str, traces: list) -> None:
    """``holder``'s ``{letter}auto``, and both limits where one is set (from the z values of
    ``traces``)."""
    low, high = holder[f"{letter}min"], holder[f"{letter}max"]
    holder[f"{letter}auto"] = low is None and high is None
    if holder[f"{letter}auto"] or (low is not None and high is not None):
        return
    values = np.concatenate([np.asarray(t.z, dtype=float).ravel() for t in traces] or [[np.nan]])
    if low is None:
        holder[f"{letter}min"] = float(np.nanmin(values))
    else:
        holder[f"{letter}max"] = float(np.nanmax(values))
