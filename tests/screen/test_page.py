"""The screen's page and table from a hand-made result (no model): every value escaped, could-not-run inputs
ranked last and said so, the table one row per input and candidate, the screen report checked when read."""

from __future__ import annotations

import json

import pytest
from driftscope.errors import ReportError
from driftscope.screen.inputs import make_input
from driftscope.screen.page import render_page
from driftscope.screen.report import load_screen, rank, table_rows, write_screen
from screen_support import SCREEN_SET

HOSTILE = '<script>alert("x")</script>'


def _results():
    item = make_input([SCREEN_SET / "screen_336x336.png"], HOSTILE, ["circle"])
    judged = {
        **item.to_dict(),
        "status": "judged",
        "score": 1.5,
        "tie_break": 20.0,
        "worst": HOSTILE,
        "candidates": {
            HOSTILE: {"score": 1.5, "terms": {"tower": 0.8}, "tower_relative_error": 0.8, "dropped_words": [HOSTILE]}
        },
    }
    failed = {"key": "a-failed", "label": "b.png", "images": [], "status": "could not run", "score": None}
    return item, [failed | {"candidates": {}}, judged]


def test_ranking_table_and_page_escape_everything(tmp_path):
    item, results = _results()
    ranked = rank(results)
    assert [r["key"] for r in ranked] == [item.key, "a-failed"]
    rows = table_rows(ranked)
    assert [(row["rank"], row["candidate"]) for row in rows] == [(1, HOSTILE), (2, None)]
    assert rows[0]["score_tower"] == 0.8 and rows[0]["dropped_words"] == HOSTILE
    data = {"name": HOSTILE, "inputs": ranked, "reference": "transformers:f32", "candidates": [HOSTILE]}
    html = render_page(tmp_path, data, {item.key: item})
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    assert html.count("<script>") == 1  # the page's own sorting script, nothing else
    assert "data:image/png;base64," in html and "could not run" in html


def test_the_screen_report_is_versioned_and_checked(tmp_path):
    _, results = _results()
    write_screen(tmp_path, {"status": "complete", "inputs": rank(results), "ranking": []})
    assert load_screen(tmp_path)["schema_version"] == 1
    data = json.loads((tmp_path / "screen.json").read_text())
    (tmp_path / "screen.json").write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(ReportError, match="schema_version"):
        load_screen(tmp_path)


def test_49_12_a_truncated_image_in_the_screen_is_ranked_could_not_run_and_the_page_is_written(tmp_path, capsys):
    """One truncated PNG among the screen's images: every capture ran, then the page's thumbnail raised (an internal
    error, no page). Now the input is "could not run" and its thumbnail a placeholder."""
    import shutil

    import yaml
    from conftest import TINY
    from driftscope.cli import main
    from driftscope.screen.page import UNREADABLE

    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(SCREEN_SET / "screen_336x336.png", images / "good.png")
    data = (SCREEN_SET / "screen_336x336.png").read_bytes()
    (images / "truncated.png").write_bytes(data[: len(data) // 2])
    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump({"checkpoint": str(TINY), "images": [], "runtimes": ["transformers:f32", "mlx:f32"]})
    )
    out = tmp_path / "screen"
    code = main(["screen", str(params), "--images", str(images / "*.png"), "--no-investigate", "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0 and "internal error" not in said.err, said.err
    ranked = json.loads((out / "screen.json").read_text())["inputs"]
    assert [(entry["label"], entry["score"] is None) for entry in ranked] == [
        ("good.png", False),
        ("truncated.png", True),
    ]
    page = (out / "index.html").read_text()
    assert UNREADABLE in page and "truncated.png" in page
