"""End to end through ``investigate``: report fields, crash reports, re-judging, tapfile imports."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml
from conftest import ROOT, TINY
from driftscope.errors import HypothesisPatchError
from driftscope.judge.contract import Contract, load_contract
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters
from driftscope.run.rejudge import rejudge
from driftscope.run.report import Report
from driftscope.taps.tapset import TapSet, TapWriter

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"


def boom(model, **_):
    """A hypothesis patch that fails while the runtime loads (stands in for any crash mid-run)."""
    raise RuntimeError("planted crash")


def _params(runtimes, **extra):
    data = {
        "name": "t",
        "checkpoint": str(TINY),
        "images": [str(CHECKER)],
        "runtimes": runtimes,
        "stages": {"blocks": True, "substages": [3]},
        **extra,
    }
    return parse_parameters(data, "test")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_checkpoint_dir):
    out = tmp_path_factory.mktemp("run")
    report = investigate(_params(["transformers:f32", "mlx:f32", "mlx:f16"]), out)
    return report, out


def test_report_has_the_documented_fields(finished):
    report, out = finished
    data = json.loads((out / "report.json").read_text())
    for key in (
        "schema_version",
        "inputs",
        "environment",
        "runtimes",
        "contract",
        "rows",
        "first_divergence",
        "verdict",
    ):
        assert key in data, key
    assert data["status"] == "complete" and data["stopped_at"] == "done"
    assert [r["label"] for r in data["runtimes"]] == ["transformers:f32", "mlx:f32", "mlx:f16"]
    assert data["inputs"]["grid_thw"] == [[1, 10, 10]]
    row = data["rows"][0]
    for key in ("stage", "reference", "candidate", "failures", "elements", "max_abs", "rms", "cosine", "max_index"):
        assert key in row, key
    assert (data["contract"]["default"]["atol"], data["contract"]["default"]["rtol"]) == (0.08, 0.08)
    # every stage of the plan is compared once per candidate
    assert len(data["rows"]) == 2 * len(data["stage_plan"])
    assert data["verdict"]["per_candidate"]["mlx:f32"] == "pass"
    assert data["first_divergence"]["mlx:f32"] is None


def test_rejudging_under_a_stricter_contract_runs_nothing(finished, tmp_path, monkeypatch):
    report, out = finished
    import driftscope.capture.runtimes as runtimes

    monkeypatch.setattr(runtimes, "get_runtime", lambda *a, **k: pytest.fail("a runtime was run"))
    stamps = {p: p.stat().st_mtime_ns for p in (out / "taps").iterdir()}
    strict = Contract.from_dict({"default": {"atol": 1e-9, "rtol": 0.0}})
    again = rejudge(out / "report.json", strict, tmp_path / "strict.json")
    assert {p: p.stat().st_mtime_ns for p in (out / "taps").iterdir()} == stamps
    assert again.verdict == "fail"
    assert again.data["first_divergence"]["mlx:f32"] is not None
    # same numbers, other judgement: max_abs of every row is unchanged
    before = {(r.stage, r.candidate): r.max_abs for r in report.rows}
    after = {(r.stage, r.candidate): r.max_abs for r in again.rows}
    assert before == after
    # the re-judged report still finds its TapSets from another directory
    assert Report.load(tmp_path / "strict.json").tapset("mlx:f32").stage_ids()


def test_a_crash_leaves_a_report_that_says_where_it_stopped(tmp_path, tiny_checkpoint_dir):
    params = _params(["transformers:f32", {"runtime": "mlx", "policy": "f32", "patch": f"{__file__}:boom"}])
    with pytest.raises(HypothesisPatchError, match="patch .*:boom raised RuntimeError: planted crash"):
        investigate(params, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "error"
    assert data["stopped_at"] == "capture:mlx:f32"
    assert "planted crash" in data["error"]["message"]
    assert data["verdict"]["status"] == "error"
    # the earlier runtime's capture is kept and recorded
    assert [r["label"] for r in data["runtimes"]] == ["transformers:f32"]
    assert TapSet(tmp_path / data["runtimes"][0]["tapset"]).stage_ids()


def test_tapfile_runtime_compares_an_imported_tapset(finished, tmp_path):
    _, out = finished
    mlx = out / "taps" / "mlx-f32.safetensors"
    report = investigate(
        _params(["transformers:f32", {"runtime": "tapfile", "label": "engine", "options": {"path": str(mlx)}}]),
        tmp_path,
    )
    assert report.verdict == "pass"
    rows = [r for r in report.rows if r.candidate == "engine"]
    assert rows and all(r.status == "pass" for r in rows)
    assert max(r.max_abs for r in rows if not r.integer) < 1e-4


def test_shape_disagreement_end_to_end(finished, tmp_path):
    """An engine whose block 2 output has the wrong shape: that row says so, the others are compared."""
    _, out = finished
    source = TapSet(out / "taps" / "mlx-f32.safetensors")
    with TapWriter(tmp_path / "engine", {"runtime": "engine", "label": "engine", "policy": "f32"}) as writer:
        for stage_id in source.stage_ids():
            value = np.asarray(source[stage_id])
            if stage_id == "vision.block.2":
                value = value[:-4]
            writer.add(
                stage_id,
                value,
                **{
                    k: v
                    for k, v in source.declaration(stage_id).items()
                    if k in ("axes", "token_order", "token_unit", "integer")
                },
            )
    report = investigate(
        _params(
            [
                "transformers:f32",
                {"runtime": "tapfile", "label": "engine", "options": {"path": str(tmp_path / "engine.safetensors")}},
            ]
        ),
        tmp_path / "run",
    )
    rows = {r.stage: r for r in report.rows}
    assert rows["vision.block.2"].status == "shape_mismatch"
    assert "100" in rows["vision.block.2"].note and "96" in rows["vision.block.2"].note
    assert rows["vision.block.3"].status == "pass" and rows["vision.merger"].status == "pass"
    assert report.data["first_divergence"]["engine"]["stage"] == "vision.block.2"


def test_reuse_returns_the_finished_report_without_running(finished, monkeypatch):
    report, out = finished
    import driftscope.run.investigation as investigation

    monkeypatch.setattr(investigation, "get_runtime", lambda *a, **k: pytest.fail("a runtime was run"))
    again = investigate(_params(["transformers:f32", "mlx:f32", "mlx:f16"]), out, reuse=True)
    assert again.data["created"] == report.data["created"]


def test_shipped_strict_contract_is_loadable_and_stricter(finished, tmp_path):
    _, out = finished
    strict = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
    default = load_contract(None)
    assert strict.tolerance("vision.block.0").atol < default.tolerance("vision.block.0").atol
    assert os.path.exists(out / "report.json")
    assert yaml.safe_load((ROOT / "parameters" / "contracts" / "strict.yaml").read_text())
