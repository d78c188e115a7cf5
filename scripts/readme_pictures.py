"""Regenerate the README's pictures from a finished demo run (``make demo``):

    .venv/bin/python scripts/readme_pictures.py outputs/<commit>/demo-shapes

docs/images/demo_error_curves.png: the error curves of notebook 01 (share of tolerance, max |a - e|, failures);
docs/images/demo_first_screen.png: notebook 01's .nocode.html as headless Chromium shows it at 1400x900.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


def curves(run: Path) -> Path:
    from driftscope.report import Report
    from driftscope.views.curves import error_curves

    figure = error_curves(Report.load(run), metrics=("tolerance_used", "max_abs", "failures"), height=2.4)
    target = IMAGES / "demo_error_curves.png"
    figure.savefig(target, dpi=80, bbox_inches="tight")
    return target


def first_screen(run: Path) -> Path:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    try:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.get((run / "01_stage_parity.nocode.html").resolve().as_uri())
        target = IMAGES / "demo_first_screen.png"
        driver.save_screenshot(str(target))
        return target
    finally:
        driver.quit()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "report.json").exists():
        sys.exit(
            "usage: scripts/readme_pictures.py RUN_DIRECTORY (a finished demo run, e.g. outputs/<commit>/demo-shapes)"
        )
    run = Path(sys.argv[1])
    IMAGES.mkdir(parents=True, exist_ok=True)
    for made in (curves(run), first_screen(run)):
        print(f"wrote {made.relative_to(ROOT)} ({made.stat().st_size // 1024} KiB)")
