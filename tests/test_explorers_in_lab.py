"""Every explorer in a real JupyterLab (headless Chromium), driven through the page: each view
and control in turn, and after each step the page draws the kernel's figure. The page's plot
is compared with a fresh drawing of the kernel's figure beside it (plotly.js' own layout of
it: subplot domains, colour ranges, trace count), so what plotly.js derives (square cells
shrink their domains) is compared like for like. After each step: no console error, every
colour bar at least 100 px long, nothing cut off or drawn over another (title, legends, colour
bars, annotations, plot areas), no kernel message over 1 MB, nothing sent to the log console
(output of a widget callback outside the explorer). After its steps each explorer is drawn at
900, 1150 and 1400 px windows (450, 700 and 950 px output areas beside the file browser): the
plot follows the output's width, still equal to the kernel's figure and with nothing
overlapping; screenshots of each are kept in the test's folder."""

from __future__ import annotations

import json
from functools import partial

import nbformat
import pytest
from lab import (
    chromium,
    console_errors,
    in_kernel,
    jupyterlab,
    message_count,
    messages_since,
    open_notebook,
    run_all_cells,
    wait_for,
    watch_messages,
)

from vizkit.widgets.redraw import MIN_WIDTH

pytestmark = pytest.mark.browser

SETUP = """\
import json
from functools import partial
import timm
import torch
import vizkit as vk
from vizkit import widgets as w

vk.viz.use_exportable_figures()
model, card = vk.zoo.load("vit_tiny_shapes")
images, labels, masks = vk.datasets.load_sample()
explorers = {}"""

# name -> the cell that builds it (the last line shows it)
CELLS = {
    "attention": 'explorers["attention"] = w.AttentionExplorer(model, images[:2])',
    "saliency": 'explorers["saliency"] = w.SaliencyComparer(model, images[:3], masks=masks[:3],'
    ' methods=["gradcam", "rollout", "random"], steps=2)',
    "mechanistic": 'explorers["mechanistic"] = w.MechanisticExplorer(model, images[:2])',
    "cka": """\
evolutions = {}
for seed in (0, 1):
    torch.manual_seed(seed)
    small = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32,
                              depth=3, num_heads=2).eval()
    evolutions[f"seed {seed}"] = vk.feature_evolution(small, images[:16], progress=False)
explorers["cka"] = w.CKAExplorer(evolutions)""",
    "history": 'explorers["history"] = w.HistoryExplorer(card)',
    "features": """\
import tempfile
folder = tempfile.mkdtemp()
store = vk.cache_activations(model, "shapes", f"{folder}/s", layers=[-2], tokens="all",
                             progress=False)
sae = vk.train_sae(store, expansion=2, k=8, tokens=10 * len(store), batch_size=256,
                   progress=False)
probes, concepts = vk.concepts.shapes_concepts(40)
named = vk.concepts.dissect(model, probes, concepts, sae, quantile=0.02, progress=False)
explorers["features"] = w.FeatureBrowser(model, sae, images, classes=card["classes"], top=4,
                                         names=named)""",
    "heads": """\
from vizkit.datasets.captions import WordTokenizer
from vizkit.models.text_image import clip_shapes
torch.manual_seed(0)
tokenizer = WordTokenizer()
clip = clip_shapes(tokenizer.vocab_size, tokenizer.context_length, layers=2).eval()
noise = torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(0))
span = vk.text_span(clip, noise, ["a circle", "a red star", "a small ring", "a dark cross"],
                    tokenizer=tokenizer, basis=3, progress=False)
texts = vk.targets.encode_texts(clip, ["a circle", "a star", "a ring"], tokenizer)
heads = [vk.concepts.dissect(clip, probes, concepts, vk.concepts.Heads(b.removeprefix("model.")),
                             quantile=0.02, progress=False) for b in span.blocks]
explorers["heads"] = w.HeadExplorer(clip, span, noise, texts, ["circle", "star", "ring"], top=4,
                                    names=heads)""",
    "circuits": """\
clean, ring, shapes, _ = vk.datasets.counterfactual_shapes(40, replace=3)
x, corrupted = clean[shapes == 0][:4], ring[shapes == 0][:4]
last = vk.concepts.dissect(model, probes, concepts, vk.concepts.Heads("blocks.3"),
                           quantile=0.02, progress=False)
explorers["circuits"] = w.CircuitExplorer(model, x, corrupted, target=0, versus=3,
                                          classes=card["classes"], names=last)""",
    "clips": """\
from vizkit.datasets.shape_clips import ShapeClips
vivit, _ = vk.zoo.load("vivit_shape_clips")
shape_clips = ShapeClips("test", n=2)
clips = torch.stack([shape_clips[i][0] for i in range(2)])
explorers["clips"] = w.AttentionExplorer(vivit, clips)""",
    "clip saliency": 'explorers["clip saliency"] = w.SaliencyComparer(vivit, clips, '
    'methods=["rollout", "saliency"], target=shape_clips.labels, progress=False)',
}

# the first head or node the kernel names (an index of the head or node list)
NAMED_LATENT = "[i for i, (_, c) in enumerate(e.latent.options) if c in e.names][0]"
NAMED_HEAD = "[h for _, h in e.head.options if f'{e.block.value} head {h}' in e.names][0]"
NAMED_NODE = "[u for u, n in enumerate(e.result.upstream) if n in e.names][0]"

# name -> the steps, each (what, control, value): "view" clicks a toggle button of that text,
# "key" presses an arrow key on the slider named control, "choose" picks an option of the
# dropdown or list named control, "click" clicks a point of the plot, "point" clicks point
# ``value`` of the trace named control, "pick" chooses the option whose index the Python
# expression ``value`` gives in the kernel, "shows" checks that the page's title and chosen options
# hold the text the Python expression ``value`` gives in the kernel (no action); a fourth item:
# what the kernel's explorer (``e``) then holds, a Python expression that must be true
SCRIPTS = {
    "attention": [
        ("view", "view", "rollout"),
        ("view", "view", "query row"),
        ("click", "", ""),
        ("view", "view", "rollout"),
        ("view", "view", "class attention"),
        ("view", "view", "query row"),
        ("key", "layer", "LEFT"),
        ("choose", "head", "1"),
        ("key", "image", "RIGHT"),
        ("view", "view", "rollout"),
    ],
    "saliency": [
        ("view", "view", "all images"),
        ("view", "view", "maps"),
        ("view", "view", "sanity check"),
        ("view", "view", "ROAD curves"),
        ("choose", "method", "gradcam"),
        ("view", "view", "maps"),
        ("choose", "method", "all"),
        ("key", "image", "RIGHT"),
        ("view", "view", "all images"),
        ("view", "view", "maps"),
    ],
    "mechanistic": [
        ("view", "view", "logit lens"),
        ("key", "layer", "LEFT"),
        ("view", "view", "heads"),
        ("key", "head", "RIGHT"),
        ("key", "image", "RIGHT"),
        ("view", "view", "logit lens"),
        ("view", "view", "heads"),
    ],
    "cka": [("choose", "result", "seed 1"), ("choose", "result", "seed 0")],
    "history": [
        ("key", "epoch", "LEFT"),
        ("choose", "quantity", "attention_entropy"),
        ("key", "epoch", "LEFT"),
        ("choose", "quantity", "test_accuracy"),
    ],
    "features": [
        ("view", "order", "logit effect"),
        ("view", "intervention", "steer"),
        ("key", "steer x max", "LEFT"),
        ("choose", "latent", 2),
        ("pick", "latent", NAMED_LATENT),
        ("shows", "", "e.names[e.latent.value].split(' (')[0]"),
        ("view", "intervention", "ablate"),
        ("view", "order", "density"),
        ("click", "", ""),
    ],
    "heads": [
        ("choose", "head", 1),
        ("pick", "head", NAMED_HEAD),
        ("shows", "", "e.names[f'{e.block.value} head {e.head.value}'].split(' (')[0]"),
        ("choose", "text", 1),
        ("key", "image", "RIGHT"),
        ("choose", "block", 0),
    ],
    "circuits": [
        ("key", "edges kept", "RIGHT"),
        ("point", "nodes", 2, "e.node.value == 2"),
        ("key", "image", "RIGHT"),
        ("choose", "node", 5),
        ("pick", "node", NAMED_NODE),
        ("shows", "", "e.names[e.result.upstream[e.node.value]].split(' (')[0]"),
        ("key", "edges kept", "LEFT"),
        ("key", "edges kept", "LEFT"),
    ],
    # the frame slider: each frame its token frame's map on the clip's colour range (the
    # page's colour range is compared with the kernel's after each step)
    "clips": [
        ("key", "frame", "RIGHT"),
        ("key", "frame", "RIGHT", "e.frame.value == 2"),
        ("click", "", "", "len(e.query) == 3 and e.query[0] == 1"),  # frame 2: token frame 1
        ("key", "frame", "LEFT"),
        ("view", "view", "rollout"),
        ("key", "frame", "RIGHT"),
        ("key", "clip", "RIGHT"),
        ("view", "view", "query row"),
    ],
    "clip saliency": [
        ("key", "frame", "RIGHT"),
        ("choose", "method", "rollout"),
        ("key", "frame", "RIGHT", "e.frame.value == 2"),
        ("choose", "method", "all"),
        ("key", "clip", "RIGHT"),
        ("key", "frame", "LEFT"),
    ],
}

# the page position of point arguments[2] of the trace named arguments[1] in plot arguments[0],
# relative to the plot's centre
POINT = """
const [gd, name, p] = arguments, L = gd._fullLayout;
const trace = gd._fullData.find(t => t.name === name);
const xa = L[trace.xaxis.replace('x', 'xaxis')], ya = L[trace.yaxis.replace('y', 'yaxis')];
const box = gd.getBoundingClientRect();
return [xa._offset + xa.l2p(trace.x[p]) - box.width / 2,
        ya._offset + ya.l2p(trace.y[p]) - box.height / 2];
"""

# plotly.js' own view of a plot div: subplot domains, colour ranges, traces, size
SUMMARY = """
function summary(gd) {
    const L = gd._fullLayout, r = v => v === undefined || v === null ? null : +(+v).toPrecision(4);
    const out = {traces: gd._fullData.length, size: [L.width, L.height], axes: {}, colors: []};
    for (const k of Object.keys(L).sort()) {
        if (/^[xy]axis\\d*$/.test(k)) out.axes[k] = L[k].domain.map(r);
        if (/^coloraxis\\d*$/.test(k)) out.colors.push([k, L[k].cauto, r(L[k].cmin), r(L[k].cmax)]);
    }
    for (const t of gd._fullData) {
        if (t.zmin !== undefined || t.zauto !== undefined)
            out.colors.push([t.type, t.zauto, r(t.zmin), r(t.zmax)]);
    }
    return out;
}
"""

# the live plot of explorer arguments[0] beside a fresh drawing of the kernel's figure
# arguments[1] at the live plot's size: [live, fresh] (whether that size fits the page is
# checked apart)
COMPARE = (
    SUMMARY
    + """
const done = arguments[arguments.length - 1];
const live = document.querySelector(`.vizkit-explorer-${arguments[0]} .js-plotly-plot`);
if (!live || !live._fullLayout) { done(null); return; }
const fig = JSON.parse(arguments[1]);
const fresh = document.createElement('div');
const size = live._fullLayout;
fresh.style.cssText = `position: absolute; left: -5000px; top: 0; width: ${size.width}px;`
    + `height: ${size.height}px`;
document.body.appendChild(fresh);
window.Plotly.newPlot(fresh, fig.data, fig.layout, {}).then(() => {
    const pair = [summary(live), summary(fresh)];
    window.Plotly.purge(fresh);
    fresh.remove();
    done(pair);
}, error => done(String(error)));
"""
)

# the entries of JupyterLab's log console (where output of a widget callback goes that no
# Output widget captures), cleared by `clear_log`
LOGGED = "return document.querySelectorAll('.jp-LogConsolePanel .jp-OutputArea-child').length"


def open_log(browser) -> None:
    """Open JupyterLab's log console for the notebook (asking again until it shows: the command
    does nothing while the notebook's logger is not set up yet) and clear it."""
    opened = """window.jupyterapp.commands.execute('logconsole:open');
                return !!document.querySelector('.jp-LogConsolePanel')"""
    wait_for(lambda: browser.execute_script(opened), 60, "the log console")
    browser.execute_script("window.jupyterapp.commands.execute('logconsole:clear')")
    wait_for(lambda: browser.execute_script(LOGGED) == 0, 30, "the log console to clear")


# the boxes of the live plot's title, legends, colour bars (whole, and the colour strip alone),
# annotations (subplot titles among them), axis titles, sliders, plot areas (their drag
# covers), of the plot itself and of its output area (the explorer's `PageWidth`); null while
# the plot is mounted again (a redraw)
BOXES = """
const explorer = document.querySelector(`.vizkit-explorer-${arguments[0]}`);
const gd = explorer && explorer.querySelector('.js-plotly-plot');
if (!gd || !gd.querySelector('.main-svg')) return null;
const box = e => { const b = e.getBoundingClientRect();
                   return [b.left, b.top, b.right, b.bottom].map(Math.round); };
const all = selector => [...gd.querySelectorAll(selector)].map(box).filter(
    ([l, t, r, b]) => r > l && b > t);
return {explorer: box(explorer.querySelector('.vizkit-page-width')),
        plot: box(gd.querySelector('.main-svg')),
        title: all('.gtitle'), legend: all('.legend .bg'), colorbars: all('.colorbar'),
        bars: all('.colorbar .cbfills'), annotations: all('.annotation'),
        axis_titles: all('text[class$=title][class^=x]:not([class*=cb]), '
                         + 'text[class$=title][class^=y]:not([class*=cb])'),
        sliders: all('.slider-container'),
        areas: all('.draglayer .nsewdrag')};
"""


def overlap(a, b) -> bool:
    """Whether boxes ``a`` and ``b`` ([left, top, right, bottom]) share more than 2 px."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 2 and min(a[3], b[3]) - max(a[1], b[1]) > 2


def assert_nothing_overlaps(boxes: dict, where: str) -> None:
    """Title, legends, colour bars, annotations, axis titles and sliders inside the plot, the
    plot inside the explorer (no horizontal scrollbar), none of them over another, and none but
    annotations and sliders over a plot area."""
    kinds = ("title", "legend", "colorbars", "annotations", "axis_titles", "sliders")
    labels = [(k, b) for k in kinds for b in boxes[k]]
    left, top, right, bottom = boxes["plot"]
    problems = [f"plot {boxes['plot']} wider than its output {boxes['explorer']}"] * (
        right > max(boxes["explorer"][2], left + MIN_WIDTH) + 1)  # fmt: skip
    for kind, (x0, y0, x1, y1) in labels:
        if x0 < left - 1 or y0 < top - 1 or x1 > right + 1 or y1 > bottom + 1:
            problems.append(f"{kind} {[x0, y0, x1, y1]} cut off (plot {boxes['plot']})")
    for i, (kind, a) in enumerate(labels):
        problems += [f"{kind} {a} over {other} {b}" for other, b in labels[i + 1 :]
                     if overlap(a, b)]  # fmt: skip
        if kind not in ("annotations", "sliders"):  # may label a point / span a plot
            problems += [f"{kind} {a} over a plot area {area}" for area in boxes["areas"]
                         if overlap(a, area)]  # fmt: skip
    assert not problems, f"{where}: {problems}"


def boxes_of(browser, key: str) -> dict:
    """`BOXES` of explorer ``key``'s plot, once drawn (a redraw after the page's width changed,
    e.g. by a scroll bar, mounts it again: no plot for a moment)."""
    return wait_for(lambda: browser.execute_script(BOXES, key), 30, "the plot to be drawn")


def page_fits(browser, key: str) -> bool:
    """Whether explorer ``key``'s plot is drawn at its output area's width (`PageWidth`); not
    while it is mounted again."""
    boxes = browser.execute_script(BOXES, key)
    if boxes is None:
        return False
    plot, output = (boxes[k][2] - boxes[k][0] for k in ("plot", "explorer"))
    return abs(plot - max(output, MIN_WIDTH)) <= 1


def explorer_notebook(path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP)] + [
        nbformat.v4.new_code_cell(f'{code}\nexplorers["{name}"]') for name, code in CELLS.items()
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    nbformat.write(nb, path)


def kernel_figure(browser, name: str) -> str:
    return in_kernel(
        browser,
        f'import plotly.io as _pio; print(json.dumps(_pio.to_json(explorers["{name}"].figure)))',
    )


def page_equals_kernel(browser, name: str, key: str) -> None:
    """Wait until the page's plot of explorer ``name`` is plotly.js' drawing of the kernel's
    figure; else fail with both."""
    seen = []

    def same() -> bool:
        seen.append(browser.execute_async_script(COMPARE, key, kernel_figure(browser, name)))
        return bool(seen[-1]) and seen[-1][0] == seen[-1][1]

    try:
        wait_for(same, 30, f"the page to draw {name}'s figure")
    except AssertionError:
        live, fresh = seen[-1] if seen[-1] else (None, None)
        raise AssertionError(f"{name}: page {live} != kernel {fresh}") from None


def explorer_box(browser, key: str):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.CSS_SELECTOR, f".vizkit-explorer-{key}")


def control(browser, key: str, description: str):
    """The control of explorer ``key`` whose description is ``description``."""
    from selenium.webdriver.common.by import By

    described = explorer_box(browser, key).find_elements(By.CSS_SELECTOR, ":has(> .widget-label)")
    for element in described:
        label = element.find_element(By.CSS_SELECTOR, ":scope > .widget-label")
        if label.text.strip() == description:
            return element
    raise AssertionError(f"no control {description!r} in explorer {key}")


# the live plot's title and the chosen option of each dropdown of explorer arguments[0]
PAGE_TEXT = """
const box = document.querySelector(`.vizkit-explorer-${arguments[0]}`);
const title = box.querySelector('.gtitle');
const chosen = [...box.querySelectorAll('select')].map(s => s.options[s.selectedIndex].text);
return [title ? title.textContent : '', ...chosen].join(' | ');
"""


def shown_in_page(browser, name: str, key: str, expression: str) -> None:
    """The page's title or a chosen option holds what ``expression`` gives in the kernel."""
    text = in_kernel(browser, f'e = explorers["{name}"]; print(json.dumps(str({expression})))')
    shown = browser.execute_script(PAGE_TEXT, key)
    assert text and text in shown, f"{name}: {text!r} is not shown: {shown!r}"


def act(browser, key: str, step: tuple) -> None:
    """Do ``step`` through the page."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    what, name, value = step[:3]
    if what == "view":
        (button,) = [b for b in control(browser, key, name).find_elements(
            By.CSS_SELECTOR, ".widget-toggle-button") if b.text.strip() == value]  # fmt: skip
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
    elif what == "key":
        handle = control(browser, key, name).find_element(By.CSS_SELECTOR, ".noUi-handle")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", handle)
        handle.click()
        handle.send_keys(getattr(Keys, f"ARROW_{value}"))
    elif what == "choose":
        element = control(browser, key, name).find_element(By.CSS_SELECTOR, "select")
        # the page may re-enable the controls (after work) a moment after the kernel is idle
        wait_for(element.is_enabled, 30, f"{name} to be enabled")
        select = Select(element)
        if isinstance(value, int):
            select.select_by_index(value)
        else:
            select.select_by_visible_text(value)
    elif what == "click":

        def click() -> bool:
            cover = explorer_box(browser, key).find_element(By.CSS_SELECTOR, ".nsewdrag")
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cover)
            x, y = -cover.size["width"] // 4, -cover.size["height"] // 4
            ActionChains(browser).move_to_element_with_offset(cover, x, y).pause(0.5).click(
                ).perform()  # fmt: skip
            return True

        wait_for(partial(unless_remounted, click), 30, "a click on the plot")
    elif what == "point":
        plot = explorer_box(browser, key).find_element(By.CSS_SELECTOR, ".js-plotly-plot")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
        x, y = browser.execute_script(POINT, plot, name, value)
        ActionChains(browser).move_to_element_with_offset(plot, round(x), round(y)).pause(
            0.5).click().perform()  # fmt: skip


def unless_remounted(action) -> bool:
    """``action()``, or False where the plot it found was mounted again before it acted (a
    redraw after scrolling changed the page's width): `wait_for` tries again."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return action()
    except StaleElementReferenceException:
        return False


def kernel_idle(browser) -> bool:
    return browser.execute_script(
        "return window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
        " === 'idle'"
    )


def check_step(browser, name: str, key: str, start: int, where: str) -> None:
    """After a step: the page draws the kernel's figure; no console error; colour bars at
    least 100 px long; no message over 1 MB; nothing in the log console."""
    page_equals_kernel(browser, name, key)
    assert console_errors(browser) == [], where
    large = [m for m in messages_since(browser, start) if m[3] > 1_000_000]
    assert not large, f"{where}: messages over 1 MB: {large}"
    assert browser.execute_script(LOGGED) == 0, f"{where}: output in the log console"
    boxes = boxes_of(browser, key)
    for left, top, right, bottom in boxes["bars"]:  # the colour strip, title and ticks aside
        assert max(right - left, bottom - top) >= 100, f"{where}: colour bar {boxes}"
    assert_nothing_overlaps(boxes, where)


@pytest.mark.timeout(900)
def test_every_explorer_draws_the_kernels_figure_after_every_step(tmp_path):
    explorer_notebook(tmp_path / "explorers.ipynb")
    with jupyterlab(tmp_path) as url, chromium() as browser:
        open_notebook(browser, url, "explorers.ipynb")
        run_all_cells(browser, 600)
        keys = in_kernel(browser, "print(json.dumps({n: e._key for n, e in explorers.items()}))")
        watch_messages(browser)
        console_errors(browser)  # what the notebook's run logged is not the steps'
        open_log(browser)
        for name, key in keys.items():
            page_equals_kernel(browser, name, key)
            for number, step in enumerate(SCRIPTS[name]):
                if step[0] == "shows":
                    shown_in_page(browser, name, key, step[2])
                    continue
                if step[0] == "pick":
                    picked = f'e = explorers["{name}"]; print(json.dumps(int({step[2]})))'
                    step = ("choose", step[1], in_kernel(browser, picked))
                start = message_count(browser)
                act(browser, key, step)
                wait_for(lambda: kernel_idle(browser), 120, f"{name} to finish {step}")
                check_step(browser, name, key, start, f"{name} step {number} {step}")
                if len(step) > 3:
                    held = f'e = explorers["{name}"]; print(json.dumps(bool({step[3]})))'
                    assert in_kernel(browser, held), f"{name} step {number}: not {step[3]}"
            for window in (900, 1150, 1400):  # the file browser open: 450, 700, 950 px outputs
                browser.set_window_size(window, 1600)  # tall: the whole explorer in view
                wait_for(partial(page_fits, browser, key), 30, f"{name} to redraw at {window} px")
                page_equals_kernel(browser, name, key)
                assert_nothing_overlaps(boxes_of(browser, key), f"{name} at {window}")
                browser.execute_script(
                    "arguments[0].scrollIntoView({block: 'start'})", explorer_box(browser, key)
                )
                browser.save_screenshot(str(tmp_path / f"{name}_{window}.png"))
            browser.set_window_size(1400, 1000)
        print(json.dumps({"screenshots": str(tmp_path)}))
