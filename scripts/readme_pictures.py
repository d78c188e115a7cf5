"""Regenerate the README's pictures (and the worked case's in docs/guide/precision.md) from a finished run:

    .venv/bin/python scripts/readme_pictures.py outputs/<commit>/demo-shapes     # make demo
    .venv/bin/python scripts/readme_pictures.py outputs/<commit>/case-layer17    # the layer-17 case

demo-shapes: docs/images/demo_error_curves.png (notebook 01's error curves: share of tolerance, max |a - e|,
failures; the static form, which the README shows), docs/images/demo_first_screen.png (notebook 01's
.nocode.html as headless Chromium shows it at 1400x900) and docs/images/demo_pictures.json (what the pictured run
found: each failing pair's first divergence and failure count, and the date and commit of the run, which the
captions name the pictures by; tests/views/test_readme_pictures.py checks the README's captions against it, and a
slow test checks it against a fresh run of the demo).

case-layer17: docs/images/case17_first_screen.png (the same screen) and, from the executed notebook 02,
case17_blocks.png (accumulated vs op-local error per block) and case17_channels.png (the channel map).
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


def curves(run: Path) -> Path:
    from driftscope.run.report import Report
    from driftscope.views.curves import error_curves

    figure = error_curves(Report.load(run), metrics=("tolerance_used", "max_abs", "failures"), height=2.4)
    target = IMAGES / "demo_error_curves.png"
    figure.savefig(target, dpi=80, bbox_inches="tight")
    return target


def summary(run: Path) -> Path:
    """docs/images/demo_pictures.json: the pictured run's verdict and each failing pair's first divergence."""
    from driftscope.run.report import Report

    report = Report.load(run)
    failing = {}
    for key, found in (report.data.get("first_divergence") or {}).items():
        if found:
            failing[key] = {
                "stage": found["stage"],
                "failures": found["failures"],
                "atol_bound_failures": found.get("atol_bound_failures"),
            }
    target = IMAGES / "demo_pictures.json"
    made = {"commit": report.data.get("commit"), "date": str(report.data.get("created", ""))[:10]}  # the figures' name
    written = {"run": report.data.get("name"), "verdict": report.verdict, "first_divergence": failing, **made}
    target.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return target


def notebook_figure(notebook: Path, alt_starts: str) -> bytes:
    """The PNG of the first figure in an executed notebook whose alt text starts with ``alt_starts``."""
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            alt = str(output.get("metadata", {}).get("image/png", {}).get("alt", ""))
            if png and alt.startswith(alt_starts):
                return base64.b64decode("".join(png) if isinstance(png, list) else png)
    raise SystemExit(f"{notebook} has no figure whose alt text starts with {alt_starts!r}")


def case_figures(run: Path) -> list[Path]:
    """Notebook 02's figures of the layer-17 case (the first candidate pair's drill-down)."""
    notebook = run / "02_layer_drilldown.ipynb"
    wanted = {
        "case17_blocks.png": "mlx:f16-manual-rmsnorm: accumulated vs op-local",
        "case17_channels.png": "vision.block.17.norm2: image 0",
    }
    written = []
    for name, alt in wanted.items():
        (IMAGES / name).write_bytes(notebook_figure(notebook, alt))
        written.append(IMAGES / name)
    return written


def first_screen(run: Path, name: str = "demo_first_screen.png") -> Path:
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
        target = IMAGES / name
        driver.save_screenshot(str(target))
        return target
    finally:
        driver.quit()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "report.json").exists():
        sys.exit(
            "usage: scripts/readme_pictures.py RUN_DIRECTORY (a finished run, e.g. outputs/<commit>/demo-shapes or "
            "outputs/<commit>/case-layer17)"
        )
    run = Path(sys.argv[1])
    IMAGES.mkdir(parents=True, exist_ok=True)
    if json.loads((run / "report.json").read_text())["name"] == "case-layer17":
        made_list = [first_screen(run, "case17_first_screen.png"), *case_figures(run)]
    else:
        made_list = [curves(run), first_screen(run), summary(run)]
    for made in made_list:
        print(f"wrote {made.relative_to(ROOT)} ({made.stat().st_size // 1024} KiB)")
