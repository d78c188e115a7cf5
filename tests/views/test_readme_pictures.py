"""The README's demo pictures and their captions say what the pictured run found (issue 34 item 7).

``scripts/readme_pictures.py`` writes ``docs/images/demo_pictures.json`` beside the pictures it makes from a demo
run (each failing pair's first divergence and failure count). Here: the captions name that stage and that count,
and the pictures are there; the slow test in tests/views/test_clean_text.py checks the JSON against a fresh run of
the demo, so a change that moves the first divergence or its count fails until the pictures are made again.
"""

from __future__ import annotations

import json
import re

from conftest import ROOT

IMAGES = ROOT / "docs" / "images"


def _captions() -> str:
    """The README's italic captions under the demo's two pictures, their lines joined (a phrase may wrap)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("(docs/images/demo_first_screen.png)")
    return " ".join(readme[start : readme.index("## ", start)].split())


def test_the_readme_captions_match_the_pictured_run():
    pictured = json.loads((IMAGES / "demo_pictures.json").read_text(encoding="utf-8"))
    assert pictured["run"] == "demo-shapes" and pictured["verdict"] == "fail"
    (failing,) = pictured["first_divergence"].values()  # the demo has one failing pair: MLX bf16
    captions = _captions()
    assert re.findall(r"first breaks the contract at `([^`]+)`", captions) == [failing["stage"]]
    if failing["atol_bound_failures"] == failing["failures"]:
        assert re.findall(r"here all (\d+) failures are", captions) == [str(failing["failures"])]
    else:
        said = re.findall(r"here (\d+) of (\d+) failures are", captions)
        assert said == [(str(failing["atol_bound_failures"]), str(failing["failures"]))]
    # each picture is named by the date and commit of the run it shows (issue 53)
    assert (
        re.findall(r"made on (\d{4}-\d{2}-\d{2}) from commit `([^`]+)`", captions)
        == [(pictured["date"], pictured["commit"])] * 2
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for picture in ("demo_first_screen.png", "demo_error_curves.png"):
        assert (IMAGES / picture).stat().st_size > 10_000 and f"](docs/images/{picture})" in readme


def pictured_summary() -> dict:
    """What the README's pictures show (for the slow test that compares it with a fresh demo run)."""
    return json.loads((IMAGES / "demo_pictures.json").read_text(encoding="utf-8"))
