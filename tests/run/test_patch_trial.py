"""Change one thing and re-run one cell: one block of a pair's candidate captured again with a patch applied,
the reference's capture reused (issue 19 item 4)."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import ParameterError
from driftscope.run.patch_trial import FOLDER, recapture_block
from driftscope.run.report import Report


@pytest.fixture(scope="module")
def run_copy(rendered, tmp_path_factory):
    """The session's rendered run, copied: the trial writes ``recapture/`` into the run it is given, and other
    tests read the original as ``driftscope run`` left it."""
    import shutil

    _, out = rendered
    target = tmp_path_factory.mktemp("trial") / "run"
    shutil.copytree(out, target, ignore=shutil.ignore_patterns("*.html", "*.ipynb"))
    return target


def test_a_block_recaptured_with_a_patch_against_the_runs_own_capture(run_copy):
    out = run_copy
    report = Report.load(out)
    run = {r.stage: r for r in report.rows if r.pair == "mlx:f32"}
    plain = recapture_block(report, "mlx:f32", 2, log=lambda message: None)
    # the run captured only block outputs: the block's substages are captured on both sides, the reference once
    stages = [r.stage for r in plain.rows]
    assert stages[-1] == "vision.block.2" and len(stages) > 10 and all(s.startswith("vision.block.2") for s in stages)
    kept = out / FOLDER / "transformers-f32-block2.safetensors"
    written = kept.stat().st_mtime_ns
    # without a patch the candidate reproduces the run exactly (same inputs, same operators)
    assert plain.rows[-1].max_abs == run["vision.block.2"].max_abs and plain.rows[-1].status == "pass"
    assert plain.frame()["run: status"].tolist()[-1] == "pass"
    patch = {"callable": "driftscope.hypotheses:scale_block_output", "kwargs": {"block": 2, "factor": 1.5}}
    scaled = recapture_block(report, "mlx:f32", 2, patch, log=lambda message: None)
    assert kept.stat().st_mtime_ns == written  # the reference's capture was reused, not made again
    ours = np.asarray(scaled.tapset["vision.block.2"])
    theirs = np.asarray(report.tapset("mlx:f32")["vision.block.2"])
    np.testing.assert_allclose(ours, theirs * np.float32(1.5), rtol=1e-6, atol=1e-7)
    assert scaled.rows[-1].status == "fail" and scaled.rows[-1].max_abs > 10 * run["vision.block.2"].max_abs
    # the substages before the output that the wrapped block still exposes do not see the patch
    before = {r.stage: r.max_abs for r in plain.rows[:-1]}
    after = {r.stage: r.max_abs for r in scaled.rows[:-1] if r.status != "missing"}
    assert after and all(after[stage] == before[stage] for stage in after)
    assert "scale_block_output" in scaled.markdown() and "fail" in scaled.markdown()


def test_a_pair_or_block_the_run_does_not_have_is_refused(run_copy):
    out = run_copy
    with pytest.raises(ParameterError, match="no runtime pair 'mlx:f64'"):
        recapture_block(out, "mlx:f64", 1)
    with pytest.raises(ParameterError, match="no block 99"):
        recapture_block(out, "mlx:f32", 99)
