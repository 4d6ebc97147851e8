"""In a real browser (headless Chromium): the demo report renders every figure without console
errors, and the quickstart's AttentionExplorer works in JupyterLab. Screenshots are saved in
each test's temporary folder. `.ci/run` installs Debian's chromium and chromium-driver."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vizkit.report import build_report

pytestmark = pytest.mark.browser
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "00_quickstart.ipynb"


@pytest.fixture
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not (chromium and chromedriver):
        pytest.skip("needs chromium and chromedriver on PATH (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    yield driver
    driver.quit()


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"Timed out after {seconds} s waiting for {what}.")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "official Jupyter news?" toast over the widgets
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
         f"--ServerApp.root_dir={tmp_path}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "lab.log").open("w"),
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "lab-settings")},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"{url}/lab", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_for(up, 60, "JupyterLab to start")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


EXPLORER_STATE = """
const boxes = [...document.querySelectorAll('.widget-vbox')].filter(
    b => b.querySelector('.js-plotly-plot') && b.querySelector('.widget-slider'));
if (!boxes.length) return null;
const gd = boxes[0].querySelector('.js-plotly-plot');
if (!gd.data || gd.data.length < 2 || !gd.layout.title) return null;
return gd.layout.title.text + ' | ' + JSON.stringify(gd.data[1].z).length;
"""


# the last cell's prompt shows its execution count ("[21]:"), not "[*]:" (queued or running)
LAST_CELL_DONE = """
const prompts = document.querySelectorAll('.jp-CodeCell .jp-InputPrompt');
return prompts.length > 0 && /\\[\\d+\\]/.test(prompts[prompts.length - 1].textContent);
"""


def test_quickstart_explorer_in_jupyterlab(browser, jupyterlab, tmp_path):
    browser.get(f"{jupyterlab}/lab/tree/{NOTEBOOK.name}")
    wait_for(
        lambda: browser.execute_script(
            "return !!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))"
        ),
        90,
        "JupyterLab to open the notebook",
    )
    time.sleep(2)  # let the kernel connect
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    wait_for(lambda: browser.execute_script(LAST_CELL_DONE), 300, "every cell to run")
    before = wait_for(lambda: browser.execute_script(EXPLORER_STATE), 30, "the AttentionExplorer")
    browser.save_screenshot(str(tmp_path / "explorer_before.png"))
    assert "layer 3" in before  # the last layer is shown first
    assert "layer 2" in move_layer_slider_left(browser, before)
    browser.save_screenshot(str(tmp_path / "explorer_after.png"))

    # a reload while the kernel runs: the saved output points at the widget, which comes back
    # from the kernel's state drawn (before the fix: 0 traces), and its sliders still redraw it
    browser.execute_script("return window.jupyterapp.commands.execute('docmanager:save')")
    time.sleep(3)
    browser.refresh()
    reloaded = wait_for(lambda: browser.execute_script(EXPLORER_STATE), 90, "the reloaded explorer")
    browser.save_screenshot(str(tmp_path / "explorer_reloaded.png"))
    assert "layer 2" in reloaded
    assert "layer 1" in move_layer_slider_left(browser, reloaded)


def move_layer_slider_left(browser, before: str) -> str:
    """Press the left arrow on the explorer's layer slider; the figure's new state."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    boxes = [
        b for b in browser.find_elements(By.CSS_SELECTOR, ".widget-vbox")
        if b.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
        and b.find_elements(By.CSS_SELECTOR, ".widget-slider")
    ]  # fmt: skip
    layer_slider = boxes[0].find_elements(By.CSS_SELECTOR, ".widget-slider")[1]  # image, layer
    handle = layer_slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", handle)
    handle.click()
    handle.send_keys(Keys.ARROW_LEFT)
    return wait_for(
        lambda: (s := browser.execute_script(EXPLORER_STATE)) != before and s,
        60,
        "the figure to change after moving the layer slider",
    )
