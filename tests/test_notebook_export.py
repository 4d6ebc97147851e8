"""A notebook exported to HTML (``jupyter nbconvert --to html --execute``) shows every figure,
offline: the notebooks call `vk.viz.use_exportable_figures`, which embeds plotly.js once."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter
from nbconvert.preprocessors import ExecutePreprocessor

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
PLOTLY_JSON = "application/vnd.plotly.v1+json"


@pytest.mark.slow
def test_exported_quickstart_draws_every_figure_offline(tmp_path):
    notebook = nbformat.read(NOTEBOOKS / "00_quickstart.ipynb", as_version=4)
    ExecutePreprocessor(timeout=300).preprocess(notebook, {"metadata": {"path": str(tmp_path)}})
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    figures = [o for o in outputs if PLOTLY_JSON in o.get("data", {})]
    assert len(figures) >= 5, f"the quickstart shows {len(figures)} figures"
    assert all("text/html" in o["data"] for o in figures), "a figure has no HTML copy"
    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert len(re.findall(r"Plotly\.newPlot\(", html)) == len(figures)
    assert not re.search(r"<script[^>]*src=[\"']https?://[^\"']*plot", html)  # nothing fetched
    assert html.count("plotly.js v") >= 1  # the library itself is embedded
