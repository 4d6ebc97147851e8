"""What every explorer shares: a figure widget that is replaced in place, a
per-image cache, and a static copy of the current view shown beside the widget."""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable
from copy import deepcopy

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

from ..viz.renderer import html_copy

__all__ = ["Explorer"]

EXPLORER_CLASS = "vizkit-explorer"  # on the widget's box, with a per-explorer class beside it
STATIC_CLASS = "vizkit-static"  # on the static copy of its view


class Explorer(ABC):
    """Base of the explorers: ``controls`` (ipywidgets, on a two-column grid, sliders the full
    width of their cell) above ``figure`` (a FigureWidget).

    Subclasses implement `_figure()` (the plotly figure for the current control values), may
    implement `_applicable()` (the controls that do nothing in the current view, disabled),
    and call `refresh()` when a control changes. ``last_update_seconds`` is how long the last
    refresh took; `static()` returns the current figure as a plain plotly Figure.

    Displayed, an explorer is two outputs: the widget, then its current view as static HTML,
    which each refresh updates. The static copy hides itself once the widget's figure is drawn
    (a live JupyterLab); where no widget manager draws it (an HTML export, readers without
    widgets) it is what one sees.
    """

    def __init__(self) -> None:
        self.figure = go.FigureWidget()
        self.controls: list[widgets.Widget] = []
        self.last_update_seconds = 0.0
        self._cache: dict[Hashable, object] = {}
        self.computed = 0  # cache misses, for tests and the curious
        self._key = uuid.uuid4().hex  # pairs the displayed widgets with their static copies
        self._static_shown = False

    def cached(self, key: Hashable, compute: Callable[[], object]) -> object:
        """``compute()`` once per key (e.g. per image and view)."""
        if key not in self._cache:
            self._cache[key] = compute()
            self.computed += 1
        return self._cache[key]

    def refresh(self, *_) -> None:
        """Redraw the figure for the current control values.

        Updating a trace or assigning a layout sends the browser only the new values, so what
        the previous view set and the new one does not (the query's outline) is cleared first,
        in Python and in the browser alike.
        """
        start = time.perf_counter()
        new = self._figure()
        with self.figure.batch_update():
            if _same_structure(self.figure, new):
                for index, (old, trace) in enumerate(zip(self.figure.data, new.data, strict=True)):
                    self.figure.plotly_restyle(_stale(old, trace, keep=("uid",)), index)
                    old.update(trace.to_plotly_json(), overwrite=True)
            else:
                self.figure.data = []
                self.figure.add_traces(list(new.data))
            self.figure.plotly_relayout(_stale(self.figure.layout, new.layout))
            self.figure.layout = new.layout
        _keep_state_for_new_views(self.figure)
        for control in self.controls:
            control.disabled = control in self._inapplicable()
        if self._static_shown:
            display(self._static_bundle(), raw=True, display_id=self._key, update=True)
        self.last_update_seconds = time.perf_counter() - start

    # title lines that speak of the controls ("click a patch"): a static copy has none
    CONTROL_HINTS: tuple[str, ...] = ()

    def static(self) -> go.Figure:
        """The current view as a plain plotly Figure, without the title's `CONTROL_HINTS`."""
        fig = go.Figure(self.figure)
        shown = fig.layout.title.text or ""
        title = shown
        for hint in self.CONTROL_HINTS:
            title = title.replace(hint, "")
        if title != shown and "<br>" not in title and fig.layout.margin.t:
            fig.layout.margin.t -= 25  # one title line less (`finish` left room for two)
        return fig.update_layout(title_text=title)

    @property
    def widget(self) -> widgets.VBox:
        for control in self.controls:
            control.layout.width = "auto"  # fills its grid cell
            control.style.description_width = "initial"
            if isinstance(control, widgets.ToggleButtons):
                control.layout.grid_area = "auto / 1 / auto / -1"  # a row of its own
        grid = widgets.GridBox(
            self.controls,
            layout=widgets.Layout(grid_template_columns="repeat(2, minmax(0, 1fr))",
                                  grid_gap="4px 24px"),
        )  # fmt: skip
        return widgets.VBox([grid, self.figure]).add_class(EXPLORER_CLASS)

    def _ipython_display_(self) -> None:
        """The widget, then its current view as static HTML that a drawn widget hides."""
        box = self.widget.add_class(f"{EXPLORER_CLASS}-{self._key}")
        widget = box._repr_mimebundle_()
        widget["text/plain"] = (
            f"{type(self).__name__}: an interactive explorer (needs a running kernel and a "
            "widget frontend such as JupyterLab 4)."
        )
        display(widget, raw=True)
        display(self._static_bundle(), raw=True, display_id=self._key)
        self._static_shown = True

    def _static_bundle(self) -> dict[str, str]:
        name = type(self).__name__
        return {
            "text/html": _static_html(self.static(), name, self._key),
            "text/plain": f"{name}: .static() returns its current view as a plotly figure.",
        }

    @abstractmethod
    def _figure(self) -> go.Figure:
        """The figure for the current control values."""

    def _inapplicable(self) -> set[widgets.Widget]:
        """Controls that do nothing for the current values of the others (shown disabled)."""
        return set()

    def _observe(self, *controls: widgets.Widget) -> None:
        for control in controls:
            control.observe(self.refresh, names="value")


def _static_html(figure: go.Figure, name: str, key: str) -> str:
    """``figure`` as captioned HTML, hidden by CSS wherever an explorer box ``key`` names holds a
    drawn plotly figure (a live widget)."""
    plot = html_copy(figure) or (
        "<p>Not drawn: this kernel's plotly renderer makes no HTML "
        "(vk.viz.use_exportable_figures() makes it).</p>"
    )
    mine = f"{STATIC_CLASS}-{key}"
    hide = f"body:has(.{EXPLORER_CLASS}-{key} .js-plotly-plot) .{mine} {{display: none}}"
    note = f"{name}: its last view (static; the controls need a running kernel)"
    return (
        f'<div class="{STATIC_CLASS} {mine}"><style>{hide}</style>'
        f'<p style="color: #666; font-size: 13px; margin: 0">{note}</p>{plot}</div>'
    )


def _stale(old, new, keep: Collection[str] = ()) -> dict[str, None]:
    """``{property: None}`` for each top-level property ``old`` (a trace or a layout) sets and
    ``new`` does not, ``keep`` aside: a plotly restyle or relayout that clears them. A nested
    one needs none: an update replaces each top-level property whole."""
    return dict.fromkeys(set(old.to_plotly_json()).difference(new.to_plotly_json(), keep))


def _keep_state_for_new_views(figure: go.FigureWidget) -> None:
    """Make the figure's synced state what it shows now.

    A FigureWidget sends each edit to the views open at the time as a delta, but its synced
    state (``_widget_data``, ``_widget_layout``: what a view opened later draws, e.g. after a
    browser reload while the kernel runs) is written only when the widget is displayed on its
    own. Inside an explorer's box that never happens, so a reloaded page showed an empty
    figure that later deltas could not fill; writing the state after each redraw fixes that.
    """
    figure._widget_data = deepcopy(figure._data)
    figure._widget_layout = deepcopy(figure._layout_obj._props)


def _same_structure(widget: go.FigureWidget, figure: go.Figure) -> bool:
    return [t.type for t in widget.data] == [t.type for t in figure.data]
