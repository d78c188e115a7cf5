"""Yardsticks are shown as such and never counted among the failing pairs (issue 53 item 3): a TF32 oracle beside an
agreeing float32 candidate, under the strict contract, fails its own pair (TF32's 10-bit mantissa), and the run
still passes, its first screen naming the TF32 runtime as a yardstick measured and not counted; re-judging keeps it
so; a float32 candidate within what a half-precision peer costs is never called "half-precision"."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT, write_params
from driftscope.judge.yardstick import apply_yardsticks, yardsticks
from driftscope.run.report import Report


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_checkpoint_dir):
    from driftscope.cli import main

    base = tmp_path_factory.mktemp("yardstick")
    params = write_params(
        base / "p.yaml",
        "yardstick",
        ["transformers:f32", "mlx:f32", "transformers:tf32"],
        contract=str(ROOT / "parameters" / "contracts" / "strict.yaml"),
        stages={"blocks": True},
        notebooks=["01_stage_parity"],
    )
    code = main(["run", str(params), "--out", str(base / "out")])
    return code, Report.load(base / "out"), base / "out"


def test_a_failing_tf32_yardstick_leaves_the_verdict_to_the_candidates(measured):
    code, report, _ = measured
    verdict = report.data["verdict"]
    assert verdict["per_candidate"] == {"mlx:f32": "pass", "transformers:tf32": "fail"}  # TF32 breaks 1e-4
    assert verdict["yardsticks"] == {"transformers:tf32": yardsticks([{"label": "t", "policy": "tf32"}], None)["t"]}
    assert verdict["status"] == "pass" and code == 0
    assert any(r.startswith("transformers:tf32: first divergence") and r.endswith("(a yardstick, not counted)")
               for r in verdict["reasons"])  # fmt: skip
    # the TF32 pair's own numbers, from its TapSets: something fails the strict contract
    stage = report.data["first_divergence"]["transformers:tf32"]["stage"]
    reference, candidate = (np.asarray(t[stage], dtype=np.float64) for t in report.pair_tapsets("transformers:tf32"))
    assert np.any(np.abs(candidate - reference) > 1e-4 + 1e-4 * np.abs(reference))


def test_the_first_screen_shows_the_yardstick_as_such(measured):
    _, _, out = measured
    page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", (out / "01_stage_parity.nocode.html").read_text()))
    page = re.sub(r"\(\s+", "(", page)  # a code span's tag reads as a space
    assert "Verdict: PASS : 0 of 1 runtime pairs fail (transformers:tf32 vs transformers:f32 is a yardstick" in page
    assert "measured and shown, not counted" in page
    assert "transformers:tf32 vs transformers:f32 (yardstick)" in page and "fail (yardstick, not counted)" in page
    assert "Finding, transformers:tf32" not in page  # a yardstick's drift is no finding


def test_rejudging_keeps_the_yardstick_out_of_the_count(measured, tmp_path):
    from driftscope.judge.contract import Contract
    from driftscope.run.rejudge import rejudge

    _, report, out = measured
    again = rejudge(out / "report.json", Contract.from_dict({"default": {"atol": 1e-7, "rtol": 1e-7}}), tmp_path)
    assert again.data["verdict"]["yardsticks"].keys() == {"transformers:tf32"}
    counted = {k: v for k, v in again.data["verdict"]["per_candidate"].items() if k != "transformers:tf32"}
    assert again.data["verdict"]["status"] == ("fail" if "fail" in counted.values() else "pass")


def test_yardsticks_are_the_policies_and_the_relative_runtimes_never_the_reference():
    runtimes = [{"label": "t:f32", "policy": {"name": "f32"}}, {"label": "t:f64", "policy": {"name": "f64"}},
                {"label": "peer", "policy": "f32"}, {"label": "m", "policy": "bf16"}]  # fmt: skip
    found = yardsticks(runtimes, {"peer": "peer", "high": "t:f64", "oracle": "t:f32"}, reference="t:f32")
    assert set(found) == {"t:f64", "peer"} and "peer" in found["peer"]
    data = {
        "pairs": [{"key": k, "reference": "t:f32", "candidate": k} for k in ("t:f64", "peer", "m")],
        "verdict": {"status": "fail", "per_candidate": {"t:f64": "fail", "peer": "fail", "m": "pass"}, "reasons": []},
    }
    apply_yardsticks(data, found)
    assert data["verdict"]["status"] == "pass" and data["verdict"]["yardsticks"].keys() == {"t:f64", "peer"}


def test_a_float32_candidate_is_within_what_half_precision_costs_never_half_precision(tmp_path):
    from driftscope.views.explain import three_way_frame

    result = {"peer": "mlx:bf16", "peer_dtype": "bfloat16", "candidates": {"mlx:f32": {"verdict": "half-precision"}}}
    report = Report(tmp_path / "report.json", {"answer": {"three_way": result}})
    assert list(three_way_frame(report)["verdict"]) == ["within what bfloat16 costs"]
