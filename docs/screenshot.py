"""Regenerate the README's picture: the report of the default zoo model, rendered in headless
Chromium, cropped to its top (docs/images/report.png).

    python docs/screenshot.py
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from vizkit.report import build_report

OUT = Path(__file__).resolve().parent / "images" / "report.png"
SECTION = "Attention"  # the report section the picture shows


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        page = build_report("vit_tiny_shapes", n=4, out=Path(folder), progress=False)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900",
                     "--hide-scrollbars"):  # fmt: skip
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            driver.get(page.as_uri())
            time.sleep(3)  # plotly draws
            heading = driver.find_element("xpath", f"//h2[contains(., '{SECTION}')]")
            driver.execute_script("arguments[0].scrollIntoView();", heading)
            time.sleep(1)
            driver.save_screenshot(str(OUT))
        finally:
            driver.quit()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
