"""The evidence index's worst stage and the run outcomes the index, the JUnit XML and the gate share."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.batch.evidence import _worst, headline, worst_stage, write_junit
from driftscope.core.storage import OutputRoot
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import Contract, Tolerance
from driftscope.run.report import Report
from driftscope.run.runrecord import exit_code, outcome
from driftscope.taps.tapset import TapWriter


def _tapset(path, label, stages):
    writer = TapWriter(path, {"runtime": label, "label": label})
    for stage, values in stages.items():
        writer.add(stage, np.asarray(values, dtype=np.float32))
    return writer.close()


def test_the_worst_stage_is_the_failing_stage_furthest_over_its_tolerance(tmp_path):
    """Block 0 fails at a small element (0.2 over a bound of 0.1: 2x) although its largest difference (0.5 at
    a reference of 100) is well inside its bound; block 1 passes at 0.9 of its bound. Block 0 is the worst."""
    reference = _tapset(tmp_path / "ref", "ref", {"vision.block.0": [100.0, 0.0], "vision.block.1": [0.0, 1.0]})
    candidate = _tapset(tmp_path / "cand", "cand", {"vision.block.0": [100.5, 0.2], "vision.block.1": [0.09, 1.0]})
    rows = compare_tapsets(reference, candidate, Contract(default=Tolerance(atol=0.1, rtol=0.01)))
    by_stage = {row.stage: row for row in rows}
    assert by_stage["vision.block.0"].status == "fail" and by_stage["vision.block.1"].status == "pass"
    assert by_stage["vision.block.0"].max_excess == pytest.approx(0.2 / 0.1, rel=1e-5)
    assert by_stage["vision.block.1"].max_excess == 0.0
    row, how = worst_stage(rows)
    assert row.stage == "vision.block.0" and how.startswith("2x its tolerance, 1/2 over")
    report = Report.start(tmp_path / "report.json", rows=[r.to_dict() for r in rows])
    assert _worst(report).startswith("vision.block.0 (cand")
    assert Report.load(tmp_path / "report.json").rows[0].max_excess == pytest.approx(2.0, rel=1e-5)  # saved


def test_a_non_finite_failure_is_worse_than_any_finite_one(tmp_path):
    reference = _tapset(tmp_path / "ref", "ref", {"vision.block.0": [1.0, 0.0], "vision.block.1": [1.0, 2.0]})
    candidate = _tapset(tmp_path / "cand", "cand", {"vision.block.0": [9.0, 0.0], "vision.block.1": [np.nan, 2.0]})
    rows = compare_tapsets(reference, candidate, Contract())
    assert rows[0].max_excess == pytest.approx(8.0 / 0.16, rel=1e-5) and rows[1].max_excess == float("inf")
    saved = Report.start(tmp_path / "report.json", rows=[r.to_dict() for r in rows])
    assert Report.load(saved.path).rows[1].max_excess is None  # JSON has no infinity: stored as null
    row, how = worst_stage(Report.load(saved.path).rows)
    assert row.stage == "vision.block.1" and how.startswith("non-finite")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"status": "complete", "verdict": "pass", "error": None}, "pass"),
        ({"status": "complete", "verdict": "fail", "error": None}, "fail"),
        ({"status": "complete", "verdict": "pass", "error": "notebook 02 failed: KeyError"}, "error"),
        ({"status": "complete", "verdict": "unknown", "error": None}, "error"),
        ({"status": "error", "verdict": "error", "error": "stopped at inputs"}, "error"),
        ({"status": "running", "verdict": "unknown", "error": None}, "running"),
    ],
)
def test_one_outcome_rule_for_index_junit_and_gate(entry, expected):
    assert outcome(entry) == expected


def test_headline_and_junit_agree_with_the_exit_code(tmp_path):
    entries = [
        {"name": "a", "status": "complete", "verdict": "pass", "error": None, "seconds": 3.5},
        {"name": "b", "status": "complete", "verdict": "fail", "error": None, "reasons": ["mlx:f16: first divergence"]},
        {"name": "c", "status": "complete", "verdict": "unknown", "error": None},
    ]
    assert exit_code(entries) == 2
    assert headline(entries) == "3 run(s): 1 pass, 1 fail, 1 could not run (1 with verdict unknown); exit code 2"
    root = OutputRoot(tmp_path)
    write_junit(root, "abc", entries)
    text = (tmp_path / "abc" / "junit.xml").read_text()
    assert 'tests="3" failures="1" errors="1"' in text
    assert 'message="mlx:f16: first divergence"' in text and 'time="3.50"' in text
    assert exit_code(entries[:2]) == 1 and exit_code(entries[:1]) == 0


def test_a_run_whose_pages_are_missing_is_not_a_pass_and_the_index_links_only_what_exists(tmp_path, rendered):
    """Issue 30 item 11: under load a batch reported a run as passing while its 01_stage_parity.html did not exist."""
    import json
    import shutil

    from driftscope.batch.evidence import index_rows
    from driftscope.run.runrecord import commit_entries

    _, out = rendered
    root = OutputRoot(tmp_path / "outputs")
    for name in ("whole", "half"):
        run = tmp_path / "outputs" / "abc123" / name
        shutil.copytree(out, run, ignore=shutil.ignore_patterns("taps", "*.ipynb"))
        report = json.loads((run / "report.json").read_text())
        (run / "report.json").write_text(json.dumps({**report, "name": name}))  # two runs of one commit
    (tmp_path / "outputs" / "abc123" / "half" / "01_stage_parity.html").unlink()
    entries = {entry["dir"]: entry for entry in commit_entries(root, "abc123")}
    assert "01_stage_parity.html" in entries["half"]["error"] and outcome(entries["half"]) == "error"
    assert not entries["whole"].get("error") and outcome(entries["whole"]) == entries["whole"]["verdict"]
    assert exit_code(list(entries.values())) == 2
    rows = {row["name"]: row for row in index_rows(root, "abc123", list(entries.values()))}
    linked = {text for row in rows.values() for _, text in row["links"]}
    assert "02_layer_drilldown.html" in linked
    half = {text for _, text in rows["half"]["links"]}
    assert "01_stage_parity.html" not in half and "01_stage_parity.nocode.html" in half
