"""A real JupyterLab in headless Chromium for the browser tests: start both, open a notebook,
run its cells, run code in its kernel, and watch the kernel's messages as the page gets them.
`.ci/run` installs Debian's chromium and chromium-driver."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium (selenium driver) whose console log is kept; skips the test where
    chromium or chromedriver is missing."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not (binary and chromedriver):
        pytest.skip("needs chromium and chromedriver on PATH (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition, seconds: float, what: str):
    """``condition()``'s first truthy value within ``seconds``, else an AssertionError."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"Timed out after {seconds} s waiting for {what}.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyterlab(root: Path):
    """A JupyterLab server on ``root`` (no token, no news toast); yields its URL."""
    settings = root / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)  # no "official Jupyter news?" toast
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=(root / "lab.log").open("w"),
        # settings and workspaces of its own: two servers (pytest workers) sharing the default
        # workspaces folder read each other's half-written files (a 500 on /lab/api/workspaces)
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(root / "lab-settings"),
             "JUPYTERLAB_WORKSPACES_DIR": str(root / "lab-workspaces")},
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


# the notebook open, its kernel connected and idle
KERNEL_READY = """
const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
const session = w && w.sessionContext && w.sessionContext.session;
return !!(session && session.kernel && session.kernel.status === 'idle'
          && document.querySelector('.jp-Notebook .jp-Cell'));
"""

# some cell's prompt shows it queued, running or run ("[*]:" or "[3]:")
A_CELL_STARTED = """
return [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].some(
    p => /\\[(\\*|\\d+)\\]/.test(p.textContent));
"""

# the last cell's prompt shows its execution count ("[21]:"), not "[*]:" (queued or running)
LAST_CELL_DONE = """
const prompts = document.querySelectorAll('.jp-CodeCell .jp-InputPrompt');
return prompts.length > 0 && /\\[\\d+\\]/.test(prompts[prompts.length - 1].textContent);
"""


def open_notebook(browser, url: str, name: str) -> None:
    """Open notebook ``name`` and wait for its kernel to be idle."""
    browser.get(f"{url}/lab/tree/{name}")
    wait_for(
        lambda: browser.execute_script(
            "return !!(window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell'))"
        ),
        90,
        "JupyterLab to open the notebook",
    )
    wait_for(lambda: browser.execute_script(KERNEL_READY), 90, "the notebook's kernel to be idle")


def run_all_cells(browser, seconds: float = 300) -> None:
    """Run every cell (again if none has started after 20 s: a run-all issued while the
    notebook's session was still settling ran nothing on a clean clone) and wait for the last."""
    for _ in range(3):
        browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        try:
            wait_for(lambda: browser.execute_script(A_CELL_STARTED), 20, "a cell to start")
            break
        except AssertionError:
            continue
    else:
        raise AssertionError("notebook:run-all-cells started no cell in three tries.")
    wait_for(lambda: browser.execute_script(LAST_CELL_DONE), seconds, "every cell to run")


RUN_IN_KERNEL = """
const done = arguments[arguments.length - 1];
const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
const future = kernel.requestExecute({code: arguments[0], store_history: false});
let out = '';
future.onIOPub = msg => {
    if (msg.header.msg_type === 'stream') out += msg.content.text;
    if (msg.header.msg_type === 'error') out += msg.content.ename + ': ' + msg.content.evalue;
};
future.done.then(() => done(out), error => done(String(error)));
"""


def in_kernel(browser, code: str):
    """Run ``code`` in the open notebook's kernel (no cell added) and return the JSON it prints
    (``print(json.dumps(...))``)."""
    out = browser.execute_async_script(RUN_IN_KERNEL, code)
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(f"the kernel printed {out!r} for {code!r}") from None


# every message the page's kernel connection receives, kept as (channel, type, parent's type,
# bytes) on window.vizkitMessages
WATCH_MESSAGES = """
if (window.vizkitMessages) return;
window.vizkitMessages = [];
const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
kernel.anyMessage.connect((_, args) => {
    if (args.direction !== 'recv') return;
    const m = args.msg;
    window.vizkitMessages.push([m.channel, m.header.msg_type,
                                (m.parent_header && m.parent_header.msg_type) || '',
                                JSON.stringify(m.content).length]);
});
"""


def watch_messages(browser) -> None:
    browser.execute_script(WATCH_MESSAGES)


def messages_since(browser, start: int) -> list[list]:
    """The messages the page received after the first ``start``."""
    return browser.execute_script("return window.vizkitMessages.slice(arguments[0])", start)


def message_count(browser) -> int:
    return browser.execute_script("return window.vizkitMessages.length")


def console_errors(browser) -> list[str]:
    """The browser console's errors since the last call (the log empties as it is read)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
