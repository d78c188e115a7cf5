"""Every registered family: notebook 02's "Try a fix" re-captures one block of a run's candidate with a ready
patch, and the patched stage's error drops (issue 31 item 1).

A family with known defects in a port runs that port unpatched and tries the patch that corrects them; a
family without runs a candidate whose block output a ready patch scales by 1.5 and tries the inverse scale.
Either way the run is a real ``driftscope run`` on the family's tiny fixture, and the trial re-captures only
the candidate's block (the reference's block stages are captured once, since the run tapped block outputs).
"""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT
from driftscope.families import FAMILIES, get_family

BLOCK = 0
FACTOR = 1.5


def _case(name: str) -> tuple[dict, str | dict]:
    """(the candidate's runtime spec, the ready patch that should close its block-``BLOCK`` error)."""
    family = get_family(name)
    if family.known_defects:
        runtime, fix = sorted(family.known_defects.items())[0]
        return {"runtime": runtime, "policy": "f32", "label": "candidate"}, fix
    scale = "driftscope.hypotheses:scale_block_output"
    planted = {"callable": scale, "kwargs": {"block": BLOCK, "factor": FACTOR}}
    runtime = "mlx" if "mlx" in family.engines else sorted(set(family.engines) - {"transformers"})[0]
    spec = {"runtime": runtime, "policy": "f32", "label": "candidate", "patch": planted}
    return spec, {"callable": scale, "kwargs": {"block": BLOCK, "factor": 1 / FACTOR}}


@pytest.mark.parametrize("name", FAMILIES.names())
def test_a_block_recaptured_with_a_ready_patch_closes_its_error(name, tmp_path):
    from driftscope.cli import main
    from driftscope.run.patch_trial import recapture_block
    from driftscope.run.report import Report

    family = get_family(name)
    candidate, fix = _case(name)
    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": f"{name}-fix-trial",
                "checkpoint": str(family.tiny.ensure()),
                "images": [str(image) for image in family.tiny.images],
                "runtimes": [{"runtime": "transformers", "policy": "f32"}, candidate],
                "stages": {"blocks": True},
                "contract": str(ROOT / "parameters" / "contracts" / "strict.yaml"),
                "notebooks": [],
            }
        )
    )
    assert main(["run", str(params), "--out", str(tmp_path / "run"), "--no-gate"]) == 0
    report = Report.load(tmp_path / "run")
    pair = report.pair_keys()[0]
    output = f"vision.block.{BLOCK}"
    before = next(row for row in report.rows if row.pair == pair and row.stage == output)
    assert before.status == "fail", f"the candidate's {output} should carry the defect ({before.max_abs:.3g})"

    trial = recapture_block(report, pair, BLOCK, fix, log=lambda message: None)
    after = {row.stage: row for row in trial.rows}[output]
    assert trial.rows[-1].stage == output and len(trial.rows) > 3  # the block's substages, then its output
    assert after.status == "pass" and after.max_abs < before.max_abs / 100, (before.max_abs, after.max_abs)
    assert "pass" in trial.markdown() and trial.frame()["patched: status"].tolist()[-1] == "pass"
