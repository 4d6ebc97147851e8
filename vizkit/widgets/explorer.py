"""What every explorer shares: a figure widget redrawn afresh (`redraw.LivePlot`), a
per-image cache, and a static copy of the current view shown beside the widget."""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

from ..viz.renderer import html_copy
from .redraw import LivePlot

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

    Work the cache does not hold yet (`cached`) runs with every control disabled and its progress
    bars drawn inside the explorer (``progress_output``, an Output below the controls), not in
    JupyterLab's log console, where output of a widget callback goes otherwise.

    Displayed, an explorer is two outputs: the widget, then its current view as static HTML,
    which each refresh updates. The static copy hides itself once the widget's figure is drawn
    (a live JupyterLab); where no widget manager draws it (an HTML export, readers without
    widgets) it is what one sees.
    """

    def __init__(self) -> None:
        self._plot = LivePlot(redraw=self.refresh)  # again when the page's width changes
        self.controls: list[widgets.Widget] = []
        self.last_update_seconds = 0.0
        self._cache: dict[Hashable, object] = {}
        self.computed = 0  # cache misses, for tests and the curious
        self._key = uuid.uuid4().hex  # pairs the displayed widgets with their static copies
        self._static_shown = False
        self.progress_output = widgets.Output()  # the progress bars of the work under way
        self._working = False

    def cached(self, key: Hashable, compute: Callable[[], object]) -> object:
        """``compute()`` once per key (e.g. per image and view), as `working` work."""
        if key not in self._cache:
            with self.working():
                self._cache[key] = compute()
            self.computed += 1
        return self._cache[key]

    @contextmanager
    def working(self) -> Iterator[None]:
        """Run the block with the controls disabled and its output (tqdm's notebook bars)
        inside the explorer; then clear that output and give the controls back their state."""
        if self._working:  # inside other work: its bars and disabling hold already
            yield
            return
        self._working = True
        before = {control: control.disabled for control in self._inputs()}
        for control in before:
            control.disabled = True
        try:
            with self.progress_output:
                yield
        finally:
            self._working = False
            self.progress_output.clear_output()
            for control, disabled in before.items():
                control.disabled = disabled

    def _enable(self) -> None:
        """Enable the controls that apply to the current view, disable the others."""
        off = self._inapplicable()
        for control in self._inputs():
            control.disabled = control in off

    def _inputs(self) -> list[widgets.Widget]:
        """Every control a user can change (disabled while work runs; a label is not one)."""
        return [control for control in self.controls if control.has_trait("disabled")]

    def refresh(self, *_) -> None:
        """Redraw the figure for the current control values (`LivePlot.show`: every browser
        view draws it afresh), then connect its click handlers (`_connect_clicks`)."""
        start = time.perf_counter()
        self._plot.show(self._figure())
        self._connect_clicks()
        self._enable()
        if self._static_shown:
            display(self._static_bundle(), raw=True, display_id=self._key, update=True)
        self.last_update_seconds = time.perf_counter() - start

    @property
    def figure(self) -> go.FigureWidget:
        """The current view (a FigureWidget: what the page draws)."""
        return self._plot.figure

    # title lines that speak of the controls ("click a patch"): a static copy has none
    CONTROL_HINTS: tuple[str, ...] = ()

    def static(self) -> go.Figure:
        """The current view as a plain plotly Figure (`_static_figure`), without the title's
        `CONTROL_HINTS`."""
        fig = go.Figure(self._static_figure())
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
        return widgets.VBox([grid, self.progress_output, self._plot.box]).add_class(EXPLORER_CLASS)

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

    def _static_figure(self) -> go.Figure:
        """The figure a static copy shows: the widget's (a clip's explorer shows all its frames
        side by side instead of the one its frame slider picks)."""
        return self.figure

    def _connect_clicks(self) -> None:  # noqa: B027 (a hook: most explorers have no clicks)
        """Connect click handlers to the figure's traces (after each redraw: it replaces
        them)."""

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
