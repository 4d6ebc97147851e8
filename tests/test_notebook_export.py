"""A notebook exported to HTML (``jupyter nbconvert --to html --execute``) shows every figure,
offline: the notebooks call `vk.viz.use_exportable_figures`, which embeds plotly.js once. An
explorer's output carries its current view as static HTML beside the widget; the export shows
it where the widget state is not stored (``--ExecutePreprocessor.store_widget_state=False``:
nbconvert's widget manager comes from a CDN and cannot draw a plotly FigureWidget)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter
from nbconvert.preprocessors import ExecutePreprocessor

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.mark.slow
def test_exported_quickstart_draws_every_figure_offline(tmp_path):
    notebook = nbformat.read(NOTEBOOKS / "00_quickstart.ipynb", as_version=4)
    execute = ExecutePreprocessor(timeout=300, store_widget_state=False)
    execute.preprocess(notebook, {"metadata": {"path": str(tmp_path)}})
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    figures = [o for o in outputs if PLOTLY_JSON in o.get("data", {})]
    explorers = [o for o in outputs if WIDGET in o.get("data", {})]
    assert len(figures) >= 5, f"the quickstart shows {len(figures)} figures"
    assert len(explorers) == 2  # the attention and history explorers
    assert all("text/html" in o["data"] for o in figures + explorers), "no HTML copy"
    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert len(re.findall(r"Plotly\.newPlot\(", html)) == len(figures) + len(explorers)
    assert "Attention of the class token at layer 3" in html  # the explorer's view
    assert not re.search(r"<script[^>]*src=[\"']https?://[^\"']*plot", html)  # nothing fetched
    assert html.count("plotly.js v") >= 1  # the library itself is embedded
