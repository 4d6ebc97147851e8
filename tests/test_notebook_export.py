"""A notebook exported to HTML (``jupyter nbconvert --to html --execute``) shows every figure and
every explorer's view, offline: the notebooks call `vk.viz.use_exportable_figures`, which embeds
plotly.js once, and an explorer shows the static copy of its view as an output of its own after
the widget. That copy is drawn with the default export too, where the widget state is stored and
nbconvert hands the widget's output to a widget manager fetched from a CDN (issue 32: the
explorers were empty there), as with ``--ExecutePreprocessor.store_widget_state=False``."""

from __future__ import annotations

import re
from copy import deepcopy
from pathlib import Path

import nbformat
import pytest
import test_browser
from nbconvert import HTMLExporter
from nbconvert.preprocessors import ExecutePreprocessor
from test_browser import wait_for

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"
browser = test_browser.browser  # the headless Chromium fixture
EXPLORERS = {
    "00_quickstart": ["AttentionExplorer", "HistoryExplorer"],
    "01_cait": ["LayerScaleExplorer"],  # shown before any figure: its copy embeds plotly.js
    "feature_browser": ["FeatureBrowser"],
    "circuit_explorer": ["CircuitExplorer"],
    "clip_explorers": ["AttentionExplorer", "SaliencyComparer"],
}
# a notebook written here: 06_features's browser on a small autoencoder (the shipped notebook
# trains a larger one for a minute; nbval runs it)
WRITTEN = {
    "feature_browser": [
        "import tempfile\nimport vizkit as vk\nvk.viz.use_exportable_figures()\n"
        'model, card = vk.zoo.load("vit_tiny_shapes")\n'
        "images = vk.datasets.load_sample()[0]\nfolder = tempfile.mkdtemp()",
        'store = vk.cache_activations(model, "shapes", f"{folder}/s", layers=[-1], '
        'tokens="all", progress=False)\nsae = vk.train_sae(store, expansion=2, k=8, '
        "tokens=5 * len(store), batch_size=256, progress=False)",
        "vk.viz.latent_maps_figure(vk.sae.latent_maps(model, sae, images[:4], [0, 1]), "
        "vk.viz.display_images(images[:4], model), [0, 1], store.name)",
        'vk.widgets.FeatureBrowser(model, sae, images, classes=card["classes"], top=4)',
    ],
    # 08_circuits's explorer alone, on four pairs
    "circuit_explorer": [
        "import vizkit as vk\nvk.viz.use_exportable_figures()\n"
        'model, card = vk.zoo.load("vit_tiny_shapes")',
        "clean, ring, shapes, _ = vk.datasets.counterfactual_shapes(40, replace=3)\n"
        "vk.widgets.CircuitExplorer(model, clean[shapes == 0][:4], ring[shapes == 0][:4], "
        'target=0, versus=3, classes=card["classes"], progress=False)',
    ],
    # the explorers on the zoo's video model: their copies show every frame side by side
    "clip_explorers": [
        "import torch\nimport vizkit as vk\nvk.viz.use_exportable_figures()\n"
        'model, card = vk.zoo.load("vivit_shape_clips")\n'
        'clips = vk.datasets.ShapeClips("test", n=2)\n'
        "x = torch.stack([clips[i][0] for i in range(2)])",
        "explorer = vk.widgets.AttentionExplorer(model, x)\nexplorer.frame.value = 2\nexplorer",
        'vk.widgets.SaliencyComparer(model, x, methods=["rollout"], progress=False)',
    ],
}
FIRST_VIEW = {  # the title of the first explorer's view, as drawn (no "click a patch")
    "00_quickstart": re.escape("Attention of the class token at layer 3, head mean"),
    "01_cait": re.escape("LayerScale at init: the attn branch is scaled by ε = 0.1"),
    # the latent shown first is the densest one the autoencoder learned
    "feature_browser": r"Latent \d+ of blocks\.3\.hook_resid_post: fires on [\d.]+% of stored "
    r"tokens; its top images \(image: its largest activation there\)",
    # then the chosen node's effect on image 0, in a second line
    "circuit_explorer": r"Circuit of circle vs ring: \d+ edges recover [\d.]+ of the score"
    r"(?:<br>|\\u003cbr\\u003e).*",
    # the clip's view: no frame in the title (every frame is drawn)
    "clip_explorers": re.escape("Attention of the class token at layer 1, head mean"),
}
# panel titles the copies hold: a clip's explorers draw every frame side by side (the comparer
# names the method over its first frame)
PANELS = {"clip_explorers": ['"text":"frame 3"', r"rollout\S{0,40}frame 0"]}  # escaped tags between
FIGURES = {"00_quickstart": 3, "01_cait": 3, "feature_browser": 1, "circuit_explorer": 0,
           "clip_explorers": 0}  # fmt: skip


def wrapped(pattern: str) -> str:
    """``pattern`` with each space matching a title's line break too (`fit_title` wraps them;
    in an HTML export's JSON the break reads ``\u003cbr\u003e``)."""
    return re.sub(r"\\? ", lambda _: r"(?: |<br>|\\u003cbr\\u003e)", pattern)


@pytest.fixture(scope="module", params=sorted(EXPLORERS))
def executed(request, tmp_path_factory) -> tuple[str, nbformat.NotebookNode]:
    """A shipped notebook (or one of `WRITTEN`) executed as ``nbconvert --execute`` does by
    default (widget state stored in the notebook's metadata)."""
    name = request.param
    if name in WRITTEN:
        cells = [nbformat.v4.new_code_cell(source) for source in WRITTEN[name]]
        notebook = nbformat.v4.new_notebook(cells=cells)
    else:
        notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    where = tmp_path_factory.mktemp(name)
    ExecutePreprocessor(timeout=300).preprocess(notebook, {"metadata": {"path": str(where)}})
    return name, notebook


def exports(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """The HTML of the default export and of one run with ``store_widget_state=False`` (the
    same outputs, no widget state)."""
    without = deepcopy(notebook)
    without.metadata.pop("widgets")
    return {
        "default": HTMLExporter().from_notebook_node(notebook)[0],
        "store_widget_state=False": HTMLExporter().from_notebook_node(without)[0],
    }


def outputs(notebook: nbformat.NotebookNode, kind) -> list[dict]:
    return [o for c in notebook.cells for o in c.get("outputs", []) if kind(o.get("data", {}))]


@pytest.mark.slow
def test_exported_notebook_holds_every_figure_and_explorer_view(executed):
    name, notebook = executed
    figures = outputs(notebook, lambda data: PLOTLY_JSON in data)
    widgets = outputs(notebook, lambda data: "interactive explorer" in data.get("text/plain", ""))
    copies = outputs(notebook, lambda data: "vizkit-static" in data.get("text/html", ""))
    assert [o["data"]["text/plain"].split(":")[0] for o in widgets] == EXPLORERS[name]
    assert len(figures) >= FIGURES[name] and len(copies) == len(widgets)
    state = notebook.metadata.widgets[STATE]["state"]
    assert all(o["data"][WIDGET]["model_id"] in state for o in widgets)  # what hid them
    assert all("text/html" not in o["data"] for o in widgets)  # else drawn twice without state
    for how, html in exports(notebook).items():
        assert len(re.findall(r"Plotly\.newPlot\(", html)) == len(figures) + len(copies), how
        assert len(re.findall(r'class="vizkit-static ', html)) == len(copies), how
        assert re.search(wrapped(FIRST_VIEW[name]).replace("ε", re.escape("\\u03b5")), html), how
        assert not re.search(r"<script[^>]*src=[\"']https?://[^\"']*plot", html)  # not fetched
        assert html.count("plotly.js v") >= 1  # the library itself is embedded
        assert all(re.search(panel, html) for panel in PANELS.get(name, ())), how


# every figure drawn, and which static copies of explorers' views are shown, drawn, and titled
DRAWN = """
const drawn = gd => !!(gd._fullLayout && gd.querySelector('.main-svg'));
const plots = [...document.querySelectorAll('.js-plotly-plot')];
const copies = [...document.querySelectorAll('.vizkit-static')];
return {plots: plots.length, drawn: plots.filter(drawn).length,
        copies: copies.filter(c => c.getClientRects().length).map(c => {
            const gd = c.querySelector('.js-plotly-plot');
            return [c.querySelector('p').textContent.split(':')[0],
                    !!gd && drawn(gd) && gd.layout.title.text];
        })};
"""


@pytest.mark.slow
@pytest.mark.browser
def test_exported_notebook_draws_every_figure_and_explorer_offline(executed, browser, tmp_path):
    """In headless Chromium without network: every figure drawn, each explorer's view shown
    once, and no error but the failed fetches of the CDN's scripts (the widget manager,
    MathJax, require.js) that nbconvert's page asks for."""
    name, notebook = executed
    figures = len(outputs(notebook, lambda data: PLOTLY_JSON in data))
    for how, html in exports(notebook).items():
        page = tmp_path / f"{name} {how}.html"
        page.write_text(html)
        browser.get(page.as_uri())
        seen = wait_for(
            lambda: (s := browser.execute_script(DRAWN))["drawn"] == s["plots"] > figures and s,
            60,
            f"{name} ({how}) to draw its figures",
        )
        browser.save_screenshot(str(page.with_suffix(".png")))
        assert seen["drawn"] == figures + len(EXPLORERS[name]), how
        assert [explorer for explorer, _ in seen["copies"]] == EXPLORERS[name], how
        assert all(title for _, title in seen["copies"]), how
        assert re.fullmatch(wrapped(FIRST_VIEW[name]), seen["copies"][0][1]), how
        errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert [e for e in errors if not re.match(r"https://\S+ - Failed to load", e)] == []
