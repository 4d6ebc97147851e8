"""The width of an explorer's output area, read in the page and synced to the kernel.

plotly's FigureWidget (an anywidget from plotly 6 on) draws in ``render()``, before its element
is in the page, so plotly.js finds no container width and draws at its default 700 px; the view
has no resize handling either. `PageWidth` is an invisible anywidget, full width, whose view
reports its own width (a ResizeObserver, settled for 150 ms) as ``width``; the kernel then
draws each figure at that width (`vizkit.widgets.redraw.LivePlot`).
"""

from __future__ import annotations

import anywidget
import traitlets

__all__ = ["PageWidth"]

_ESM = """
export default {
  render({ model, el }) {
    el.style.cssText = "width: 100%; height: 0; overflow: hidden";
    let timer = null;
    const report = () => {
      const width = Math.round(el.getBoundingClientRect().width);
      if (width > 0 && width !== model.get("width")) {
        model.set("width", width);
        model.save_changes();
      }
    };
    const observer = new ResizeObserver(() => {
      clearTimeout(timer);
      timer = setTimeout(report, 150);
    });
    observer.observe(el);
    return () => { clearTimeout(timer); observer.disconnect(); };
  },
};
"""


class PageWidth(anywidget.AnyWidget):
    """``width``: the px width its view last measured in the page (0 until a view is drawn)."""

    _esm = traitlets.Unicode(_ESM).tag(sync=True)
    width = traitlets.Int(0).tag(sync=True)

    def __init__(self) -> None:
        super().__init__(layout={"width": "100%", "height": "0px"})
        self.add_class("vizkit-page-width")
