"""What every explorer shares: a figure widget that is replaced in place, a
per-image cache, and a static fallback."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from copy import deepcopy

import ipywidgets as widgets
import plotly.graph_objects as go

__all__ = ["Explorer"]


class Explorer(ABC):
    """Base of the explorers: ``controls`` (ipywidgets, on a two-column grid, sliders the full
    width of their cell) above ``figure`` (a FigureWidget).

    Subclasses implement `_figure()` (the plotly figure for the current control values), may
    implement `_applicable()` (the controls that do nothing in the current view, disabled),
    and call `refresh()` when a control changes. ``last_update_seconds`` is how long the last
    refresh took; `static()` returns the current figure as a plain plotly Figure (for HTML
    export, or environments without widgets).
    """

    def __init__(self) -> None:
        self.figure = go.FigureWidget()
        self.controls: list[widgets.Widget] = []
        self.last_update_seconds = 0.0
        self._cache: dict[Hashable, object] = {}
        self.computed = 0  # cache misses, for tests and the curious

    def cached(self, key: Hashable, compute: Callable[[], object]) -> object:
        """``compute()`` once per key (e.g. per image and view)."""
        if key not in self._cache:
            self._cache[key] = compute()
            self.computed += 1
        return self._cache[key]

    def refresh(self, *_) -> None:
        """Redraw the figure for the current control values."""
        start = time.perf_counter()
        new = self._figure()
        with self.figure.batch_update():
            if _same_structure(self.figure, new):
                for old, trace in zip(self.figure.data, new.data, strict=True):
                    old.update(trace.to_plotly_json(), overwrite=True)
            else:
                self.figure.data = []
                self.figure.add_traces(list(new.data))
            self.figure.layout = new.layout
        _keep_state_for_new_views(self.figure)
        for control in self.controls:
            control.disabled = control in self._inapplicable()
        self.last_update_seconds = time.perf_counter() - start

    def static(self) -> go.Figure:
        return go.Figure(self.figure)

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
        return widgets.VBox([grid, self.figure])

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The widget where the frontend renders widgets (JupyterLab 4); elsewhere the current
        view as a static figure (HTML: an export with ``store_widget_state=False``, readers
        without widgets) and a line that says what this is."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/html"] = self.static().to_html(include_plotlyjs=False, full_html=False)
        bundle["text/plain"] = (
            f"{type(self).__name__}: an interactive explorer (needs a widget-enabled frontend "
            "such as JupyterLab 4); .static() returns the current view as a plotly figure."
        )
        return bundle

    @abstractmethod
    def _figure(self) -> go.Figure:
        """The figure for the current control values."""

    def _inapplicable(self) -> set[widgets.Widget]:
        """Controls that do nothing for the current values of the others (shown disabled)."""
        return set()

    def _observe(self, *controls: widgets.Widget) -> None:
        for control in controls:
            control.observe(self.refresh, names="value")


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
