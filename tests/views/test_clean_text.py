"""Rendered pages say words, not Python values (issue 34 item 6): no "None patches", "nan" tolerance, bare
True/False, snake_case headers, list reprs, pandas index columns, "1 failures", "all 1 failures" or "Progress log
(1 lines)". The fast tests read the fixture run's notebooks 01, 02, 04 and a notebook 03; the slow one renders each
notebook of each family demo (``parameters/demo_*.yaml`` of the four families) and reads every page.
"""

from __future__ import annotations

import json

import pytest
from chromium import chromium, needs_chromium, open_page
from clean_text import problems
from conftest import ROOT

DEMOS = ["demo_shapes", "demo_qwen3_vl", "demo_qwen3_vl_moe", "demo_molmo2"]  # one per family


def _check(out, names) -> dict[str, list[str]]:
    found = {name: problems((out / f"{name}.nocode.html").read_text(encoding="utf-8")) for name in names}
    return {name: issues for name, issues in found.items() if issues}


def test_the_checker_finds_each_pattern():
    page = (
        "<p>Processor x; None patches; its tolerance nan; detected True</p><p>images ['140x140', '140x140'] at "
        "[698, 10]</p><p>1 failures; all 1 failures</p><details><summary>Progress log (1 lines): what</summary>"
        "<pre>grid [[1, 10, 10]] None</pre></details><table><thead><tr><th>top1_agree</th><th>mlx-without-tanh_gelu "
        "status</th></tr></thead><tbody><tr><th>0</th><td>a</td></tr><tr><th>1</th><td>b</td></tr></tbody></table>"
    )
    kinds = sorted({finding.split(":", 1)[0] for finding in problems(page)})
    assert kinds == sorted(
        [
            "a raw None",
            "a raw nan",
            "a bare True or False",
            "a list or dict repr",
            "a plural after 1",
            "'all 1'",
            "a snake_case header",
            "a pandas index column",
        ]
    )
    assert sum("a raw None" in f for f in problems(page)) == 1  # the progress log's own body is a log, not prose
    assert not [f for f in problems(page) if f.startswith("a snake_case header") and "tanh_gelu" in f]  # a label
    assert problems("<p>1 failure, 4 failures, 0.1 failures per row; all 12 pass</p>") == []


def test_the_fixture_runs_pages_say_words(rendered):
    _, out = rendered
    names = [path.name.removesuffix(".nocode.html") for path in sorted(out.glob("0*.nocode.html"))]
    assert {"01_stage_parity", "02_layer_drilldown", "04_negative_controls"} <= set(names)
    assert not _check(out, names)


def test_a_geometry_page_says_words(tmp_path):
    """Notebook 03 without a run: its tables shown without a pandas index, grids written out."""
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    image = str(ROOT / "fixtures" / "images" / "shapes_448.png")
    to_html(execute("03_window_geometry", tmp_path, {"image_path": image}, cwd=ROOT, log_output=False))
    assert not _check(tmp_path, ["03_window_geometry"])


@pytest.fixture(scope="module", params=DEMOS)
def demo(request, tmp_path_factory):
    """``driftscope run`` of one family demo with its notebooks: (its notebooks, output directory)."""
    from driftscope.cli import main

    out = tmp_path_factory.mktemp(request.param) / "out"
    assert main(["run", str(ROOT / "parameters" / f"{request.param}.yaml"), "--out", str(out)]) in (0, 1)
    return [json.loads((out / "report.json").read_text())["parameters"]["notebooks"], out]


@pytest.mark.slow
def test_every_page_of_every_family_demo_says_words(demo):
    names, out = demo
    names = sorted({*names, *(p.name.removesuffix(".nocode.html") for p in out.glob("0*.nocode.html"))})
    assert len(names) >= 4
    assert not _check(out, names)


@pytest.mark.slow
@needs_chromium
def test_every_family_demos_headline_tables_fit_1400_px(demo):
    """Issue 34 item 2 on each family's demo: notebook 01's headline table and notebook 04's power table (its
    "why it is not detected" column included) need no sideways scroll at 1400 px."""
    _, out = demo
    with chromium(1400, 900) as browser:
        for page, header in (
            ("01_stage_parity", "suspected cause"),
            ("04_negative_controls", "why it is not detected"),
        ):
            open_page(browser, (out / f"{page}.nocode.html").as_uri())
            box = browser.execute_script(
                f"""const box = Array.from(document.querySelectorAll('div.driftscope-table'))
                  .find(b => b.querySelector('thead') && b.querySelector('thead').innerText.includes({header!r}));
                return box && [box.scrollWidth, box.clientWidth, box.getBoundingClientRect().right];"""
            )
            assert box and box[0] <= box[1] and box[2] <= 1400, (page, box)


@pytest.mark.slow
def test_the_readme_pictures_are_of_the_current_demo(demo):
    """Issue 34 item 7: what docs/images/demo_pictures.json says the README's pictures show (its captions are
    checked against it in tests/views/test_readme_pictures.py) is what a fresh run of the demo finds."""
    _, out = demo
    report = json.loads((out / "report.json").read_text())
    if report["name"] != "demo-shapes":
        pytest.skip("the README pictures the shapes demo")
    pictured = json.loads((ROOT / "docs" / "images" / "demo_pictures.json").read_text())
    found = {
        key: {"stage": f["stage"], "failures": f["failures"], "atol_bound_failures": f.get("atol_bound_failures")}
        for key, f in report["first_divergence"].items()
        if f
    }
    assert pictured["first_divergence"] == found and pictured["verdict"] == report["verdict"]["status"], (
        "the README's pictures are stale: run `make demo`, then scripts/readme_pictures.py on its run"
    )
