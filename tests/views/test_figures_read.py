"""Figures that read (issue 53 item 5), checked in headless Chromium at 1400x900 from each rendered page alone
(tests/views/figure_checks.py): no tick label over another, integer ticks on integer axes, unique panel titles, long
tables scrolling in their own box with their header kept. By default the fixture run's pages (notebooks 01, 02 and
04, and 06 rendered on a copy of the run); under ``-m slow`` every page of every shipped parameter file."""

from __future__ import annotations

import json

import pytest
from chromium import chromium, needs_chromium
from conftest import ROOT
from figure_checks import check

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def test_the_fixture_runs_pages_read(browser, rendered, answer_page):
    _, out = rendered
    pages = [out / f"{name}.nocode.html" for name in ("01_stage_parity", "02_layer_drilldown", "04_negative_controls")]
    problems = [problem for page in [*pages, answer_page] for problem in check(browser, page)]
    assert problems == []


def test_the_checks_find_what_they_look_for(browser, tmp_path):
    """A page with block names written over each other, a layer axis ticked at half layers, two panels of one
    title, and a long table with no box of its own: each is found."""
    facts = {
        "title": "",
        "panels": [
            {"title": "iree:f32", "colorbar": False, "texts": [{"text": "b5", "box": [10, 0, 22, 10]},
                                                               {"text": "b6", "box": [20, 0, 32, 10]}],
             "x": {"label": "stage", "scale": "linear", "ticks": []},
             "y": {"label": "layer", "scale": "linear",
                   "ticks": [{"value": -0.5, "text": "-0.5", "box": [0, 40, 8, 48]},
                             {"value": 0.0, "text": "0.0", "box": [0, 60, 8, 68]}]}},
            {"title": "iree:f32", "colorbar": False, "texts": [], "x": {"label": "", "scale": "linear", "ticks": []},
             "y": {"label": "", "scale": "linear", "ticks": []}},
        ],
    }  # fmt: skip
    rows = "".join(f"<tr><td>{i}</td></tr>" for i in range(60))
    page = tmp_path / "bad.html"
    page.write_text(
        f"<html><body><img alt='bad' data-figure='{json.dumps(facts)}' src='data:image/png;base64,'>"
        f"<div class='driftscope-table'><table><thead><tr><th>n</th></tr></thead><tbody>{rows}</tbody></table></div>"
        "<details><summary>Progress log</summary></details></body></html>"
    )
    problems = check(browser, page)
    assert any("texts 'b5' and 'b6' overlap" in p for p in problems), problems
    assert any("axis 'layer' ticked" in p for p in problems), problems
    assert any("panel titles repeat: ['iree:f32']" in p for p in problems), problems
    assert any("does not scroll in its own box" in p for p in problems), problems


SHIPPED = sorted(path.stem for path in (ROOT / "parameters").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_every_page_of_every_shipped_parameter_file_reads(name, browser, tmp_path):
    from driftscope.cli import main

    out = tmp_path / name
    assert main(["run", str(ROOT / "parameters" / f"{name}.yaml"), "--out", str(out), "--no-gate"]) == 0
    if name == "case_layer17":  # notebook 07 renders the precision search's answer
        main(["precision", str(ROOT / "parameters" / f"{name}.yaml"), "--candidate", "mlx:f16-manual-rmsnorm",
              "--out", str(out), "--no-verify"])  # fmt: skip
    pages = sorted(out.glob("0*.nocode.html"))
    assert pages
    problems = [problem for page in pages for problem in check(browser, page)]
    assert problems == []
