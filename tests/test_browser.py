"""In a real browser (headless Chromium): the demo report renders every figure without console
errors and its score table fits a 900 px window, and the quickstart's AttentionExplorer works
in JupyterLab: each explorer drawn once (its static copy hidden), and after every control change
(a click on a patch, a view, a slider) the browser draws the kernel's view. Screenshots are
saved in each test's temporary folder. `.ci/run` installs Debian's chromium and chromium-driver;
`tests/lab.py` starts them."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from lab import chromium, console_errors, in_kernel, open_notebook, run_all_cells, wait_for
from lab import jupyterlab as lab_server

from vizkit.report import build_report

pytestmark = pytest.mark.browser
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "00_quickstart.ipynb"


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


def test_report_renders_every_figure_without_console_errors(browser, tmp_path):
    page = build_report(out=tmp_path / "report", progress=False)
    expected = page.read_text().count("Plotly.newPlot")
    browser.get(page.as_uri())
    rendered = wait_for(
        lambda: (
            browser.execute_script(
                "return document.querySelectorAll('.js-plotly-plot .main-svg').length"
            )
            >= expected
        ),
        30,
        f"{expected} plotly figures to render",
    )
    assert rendered
    drawn = browser.execute_script(
        "return [...document.querySelectorAll('.js-plotly-plot')]"
        ".filter(gd => gd._fullLayout && gd.querySelector('.main-svg')).length"
    )
    assert drawn == expected
    browser.save_screenshot(str(tmp_path / "report.png"))
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    browser.set_window_size(900, 1000)  # a narrow window: the score table wraps, no scrolling
    browser.refresh()  # figures lay out for the window they open in
    wait_for(
        lambda: (
            browser.execute_script(
                "return document.querySelectorAll('.js-plotly-plot .main-svg').length"
            )
            >= expected
        ),
        30,
        "the figures to render at 900 px",
    )
    table = browser.find_element("css selector", "table.scores")
    browser.execute_script("arguments[0].scrollIntoView()", table)
    widths = browser.execute_script(
        "const t = arguments[0]; return [t.scrollWidth, t.clientWidth, "
        "document.documentElement.scrollWidth, document.documentElement.clientWidth]",
        table,
    )
    assert widths[0] <= widths[1] and widths[2] <= widths[3], widths
    browser.save_screenshot(str(tmp_path / "report_900.png"))


@pytest.fixture
def jupyterlab(tmp_path):
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    with lab_server(tmp_path) as url:
        yield url


EXPLORER_STATE = """
const boxes = [...document.querySelectorAll('.vizkit-explorer')].filter(
    b => b.querySelector('.js-plotly-plot') && b.querySelector('.widget-slider'));
if (!boxes.length) return null;
const gd = boxes[0].querySelector('.js-plotly-plot');
if (!gd.data || gd.data.length < 2 || !gd.layout.title) return null;
return gd.layout.title.text + ' | ' + JSON.stringify(gd.data[1].z).length;
"""

# the first explorer's view as its plot div holds it: title and query outlines
BROWSER_VIEW = """
const gd = document.querySelector('.vizkit-explorer .js-plotly-plot');
const shapes = (gd && gd.layout.shapes) || [];
return gd && {title: gd.layout.title.text,
              shapes: shapes.map(s => [s.type, s.x0, s.x1, s.y0, s.y1])};
"""

# the same, as the kernel's `explorer` holds it (run beside the notebook, no cell added)
KERNEL_CODE = """print(__import__("json").dumps({
    "title": explorer.figure.layout.title.text,
    "shapes": [[s.type, s.x0, s.x1, s.y0, s.y1] for s in explorer.figure.layout.shapes]}))"""

# static copies of the explorers' views: present in the notebook, none shown beside a widget
STATIC_COPIES = """
const copies = [...document.querySelectorAll('.vizkit-static')];
return {copies: copies.length, shown: copies.filter(c => c.getClientRects().length).length,
        drawn: [...document.querySelectorAll('.vizkit-explorer .js-plotly-plot')].filter(
            gd => gd.querySelector('.main-svg')).length};
"""


# alone it takes about a minute; under `make test`'s two workers the kernel runs the notebook's
# cells beside other tests, and the whole test took 296 s twice on a clean clone here (the
# per-test limit is 300 s): its own waits bound each step, this bounds the sum
@pytest.mark.timeout(600)
def test_quickstart_explorer_in_jupyterlab(browser, jupyterlab, tmp_path):
    open_notebook(browser, jupyterlab, NOTEBOOK.name)
    run_all_cells(browser)
    before = wait_for(lambda: browser.execute_script(EXPLORER_STATE), 30, "the AttentionExplorer")
    browser.save_screenshot(str(tmp_path / "explorer_before.png"))
    assert "layer 3" in before  # the last layer is shown first
    assert_one_view_per_explorer(browser)
    browser.set_window_size(1400, 2400)  # the whole explorer and what follows it
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", explorer_box(browser))
    browser.save_screenshot(str(tmp_path / "explorer_whole.png"))  # no static copy below it
    browser.set_window_size(1400, 1000)

    # issue 32: after a click on a patch its outline stayed in the browser in the other views
    click_a_patch(browser)
    assert_browser_draws_kernel_view(browser, "Attention of patch")
    assert len(browser.execute_script(BROWSER_VIEW)["shapes"]) == 1
    for view in ("class attention", "rollout", "query row"):
        click_view(browser, view)
        assert_browser_draws_kernel_view(browser, view.replace("query row", "Attention of"))
    browser.save_screenshot(str(tmp_path / "explorer_query.png"))
    before = browser.execute_script(EXPLORER_STATE)
    assert "layer 2" in move_layer_slider_left(browser, before)
    assert_browser_draws_kernel_view(browser, "layer 2")
    browser.save_screenshot(str(tmp_path / "explorer_after.png"))

    # a reload while the kernel runs: the saved output points at the widget, which comes back
    # from the kernel's state drawn (before the fix: 0 traces), and its sliders still redraw it
    browser.execute_script("return window.jupyterapp.commands.execute('docmanager:save')")
    time.sleep(3)
    reloaded = reloaded_explorer(browser)
    browser.save_screenshot(str(tmp_path / "explorer_reloaded.png"))
    assert "layer 2" in reloaded
    assert_one_view_per_explorer(browser)
    assert "layer 1" in move_layer_slider_left(browser, reloaded)
    assert_browser_draws_kernel_view(browser, "layer 1")


# a widget output the front end could not restore: its widget manager settled before the kernel's
# models arrived (a race in the front end on a loaded machine, jupyter-widgets/ipywidgets#3823)
MODEL_NOT_FOUND = """
return [...document.querySelectorAll('.jupyter-widgets.jp-OutputArea-output')].some(
    o => o.innerText.includes('model not found'));
"""


def reloaded_explorer(browser, tries: int = 3) -> str:
    """The first explorer's state after a page reload, reloading again (as a user would) when
    the front end lost the race to the kernel's widget models, up to ``tries`` reloads."""
    for _ in range(tries):
        browser.refresh()
        state = wait_for(
            lambda: (
                browser.execute_script(EXPLORER_STATE)
                or ("lost" if browser.execute_script(MODEL_NOT_FOUND) else None)
            ),
            180,
            "the reloaded explorer",
        )
        if state != "lost":
            return state
    raise AssertionError(f"The front end lost the kernel's widget models on {tries} reloads.")


EXPLORER_OUTPUTS = """
return [...document.querySelectorAll('.vizkit-explorer')].map(b => {
    const area = b.closest('.jp-OutputArea-output') || b;
    const gd = b.querySelector('.js-plotly-plot');
    return {plot: !!gd, drawn: !!(gd && gd.querySelector('.main-svg')),
            title: gd && gd.layout && gd.layout.title ? gd.layout.title.text : null,
            text: area.innerText.slice(0, 200)};
});
"""


def assert_one_view_per_explorer(browser) -> None:
    """Each explorer's widget is drawn and the static copy of its view beside it hidden. The
    page is scrolled to each explorer in turn while it waits, as a reader would scroll: the
    notebook skips the layout of cells out of view (JupyterLab's windowing mode)."""
    polls = iter(range(10**6))

    def both_drawn():
        browser.execute_script(
            "const boxes = document.querySelectorAll('.vizkit-explorer');"
            "boxes[arguments[0] % boxes.length]?.scrollIntoView({block: 'center'});",
            next(polls) // 8,  # two seconds on each explorer
        )
        state = browser.execute_script(STATIC_COPIES)
        return state["drawn"] >= 2 and state

    try:
        state = wait_for(both_drawn, 120, "both explorers of the quickstart to draw")
    except AssertionError as timeout:
        raise AssertionError(f"{timeout} {browser.execute_script(EXPLORER_OUTPUTS)}; "
                             f"console errors: {console_errors(browser)}") from None  # fmt: skip
    assert state == {"copies": 2, "shown": 0, "drawn": 2}


def assert_browser_draws_kernel_view(browser, expected: str) -> None:
    """The kernel's explorer shows ``expected`` in its title, and the browser draws exactly
    the kernel's view: title and query outlines."""
    kernel = wait_for(
        lambda: (v := in_kernel(browser, KERNEL_CODE)) and expected in v["title"] and v,
        60,
        f"the kernel's explorer to show {expected!r}",
    )
    seen = []
    try:
        wait_for(lambda: seen.append(browser.execute_script(BROWSER_VIEW)) or seen[-1] == kernel,
                 30, "the browser to draw the kernel's view")  # fmt: skip
    except AssertionError:
        raise AssertionError(f"browser {seen[-1]} != kernel {kernel}") from None


def explorer_box(browser):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, ".vizkit-explorer")[0]


def click_a_patch(browser) -> None:
    """Click the explorer's map a quarter of its size up and left of its centre."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    cover = explorer_box(browser).find_element(By.CSS_SELECTOR, ".nsewdrag")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cover)
    x, y = -cover.size["width"] // 4, -cover.size["height"] // 4
    ActionChains(browser).move_to_element_with_offset(cover, x, y).pause(0.5).click().perform()


def click_view(browser, view: str) -> None:
    from selenium.webdriver.common.by import By

    (button,) = [
        b for b in explorer_box(browser).find_elements(By.CSS_SELECTOR, ".widget-toggle-button")
        if b.text.strip() == view
    ]  # fmt: skip
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()


def move_layer_slider_left(browser, before: str) -> str:
    """Press the left arrow on the explorer's layer slider; the figure's new state."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    layer_slider = explorer_box(browser).find_elements(By.CSS_SELECTOR, ".widget-slider")[1]
    handle = layer_slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", handle)
    start = handle.get_attribute("aria-valuenow")
    for _ in range(3):  # a key pressed before the reloaded slider listens is lost: press again
        handle.click()
        handle.send_keys(Keys.ARROW_LEFT)
        try:
            wait_for(lambda: handle.get_attribute("aria-valuenow") != start, 10, "the slider")
            break
        except AssertionError:
            continue
    return wait_for(
        lambda: (s := browser.execute_script(EXPLORER_STATE)) != before and s,
        120,
        "the figure to change after moving the layer slider",
    )
