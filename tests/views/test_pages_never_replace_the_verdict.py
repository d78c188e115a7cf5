"""Pages that never turn a verdict into "could not run" (issue 50 item 5): the three crashes the issue found, each
on the report that made it, and a page that fails reported beside the verdict. Every parameter file under
``parameters/`` runs with every page it lists under ``-m slow``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import ROOT, SHAPES, TINY
from driftscope.cli import main
from driftscope.run.report import Report
from driftscope.taps.tapset import TapWriter


def _report(tmp_path, family: str, conclusions: dict | None = None, pairs: bool = True) -> Report:
    """A finished report of two runtimes whose TapSets hold one KV-cache stage, as a run writes them (without
    ``pairs``: the candidate never loaded, so only the reference's)."""
    runtimes = []
    for label, shift in (("reference", 0.0), ("candidate", 0.5))[: 2 if pairs else 1]:
        writer = TapWriter(tmp_path / "taps" / label, {"runtime": label, "label": label})
        writer.add("text.cache.prefill.keys", np.full((2, 1, 3, 4), 1.0 + shift, dtype=np.float32))
        writer.close()
        runtimes.append({"label": label, "tapset": f"taps/{label}.safetensors"})
    data = {
        "status": "complete",
        "family": family,
        "reference": "reference",
        "runtimes": runtimes,
        "pairs": [{"key": "candidate", "reference": "reference", "candidate": "candidate"}] if pairs else [],
        "rows": [],
        "stage_plan": [],
        "plan_meta": {},
        "conclusions": conclusions or {},
        "verdict": {"status": "fail" if pairs else "could not run", "per_candidate": {}, "reasons": []},
    }
    return Report(tmp_path / "report.json", data)


def test_a_cache_stage_has_no_patch_map_in_a_family_that_lays_out_no_text_token(tmp_path):
    """Molmo2 lays out no token of a text stage: notebook 02's spatial map of a ``text.cache.*`` first divergence
    raised IndexError; there is no image's patches to draw, so no map."""
    from driftscope.views.drill import spatial_map
    from driftscope.views.errormaps import patch_error_grid

    report = _report(tmp_path, "molmo2")
    assert patch_error_grid(report, "text.cache.prefill.keys", "candidate") is None
    figure = spatial_map(report, "text.cache.prefill.keys", "candidate")
    assert figure is not None


def test_a_data_stage_with_a_ready_patch_gets_its_hint(tmp_path):
    """video_time_defect.yaml: the first divergence is text.position_ids (data) with a ready patch; notebook 02's
    hint raised KeyError: 'stage' (a data conclusion names its first divergence, no introducing stage)."""
    from driftscope.views.drill import recapture_hint

    patch = "driftscope.hypotheses:video_time_positions"
    conclusion = {"kind": "data", "first_divergence": "text.position_ids", "ready_patches": [patch]}
    report = _report(tmp_path, "qwen2_5_vl", {"candidate": conclusion})
    said = recapture_hint("candidate", [0], report)
    assert "text.position_ids" in said and patch in said and "run the pair again with it" in said


def test_the_headline_table_of_a_run_whose_candidates_all_failed_to_load(tmp_path):
    """No candidate loaded: no pair at all; notebook 01's table raised KeyError: 'verdict'."""
    from driftscope.views.parity import DIVERGENCE_COLUMNS, divergence_frame

    frame = divergence_frame(_report(tmp_path, "qwen2_5_vl", pairs=False))
    assert frame.empty and tuple(frame.columns) == DIVERGENCE_COLUMNS


def test_a_page_that_fails_is_reported_beside_the_verdict(tmp_path, capsys):
    """A notebook that raises (here a parameter the page cannot use: a pair the run does not have) leaves the
    run's exit code the verdict's, 1, and says the page failed: in the log, in report.json and in ``show``."""
    params = tmp_path / "p.yaml"
    notebook = ROOT / "notebooks" / "02_layer_drilldown.ipynb"
    broken = json.loads(notebook.read_text())
    for cell in broken["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            cell["source"] = ["".join(cell["source"]) + '\npair = "no-such-pair"\n']
    (tmp_path / "nb").mkdir()
    params.write_text(
        yaml.safe_dump(
            {
                "name": "page-beside",
                "checkpoint": str(TINY),
                "images": [str(SHAPES)],
                "runtimes": [
                    "transformers:f32",
                    {
                        "runtime": "transformers",
                        "label": "scaled",
                        "patch": {
                            "callable": "driftscope.hypotheses:scale_block_output",
                            "kwargs": {"block": 1, "factor": 1.5},
                        },
                    },
                ],
                "stages": {"blocks": True},
                "replay": False,
                "narrow": False,
                "notebooks": ["01_stage_parity"],
            }
        )
    )
    out = tmp_path / "out"
    assert main(["run", str(params), "--out", str(out)]) == 1
    report = Report.load(out)
    assert report.verdict == "fail"
    from driftscope.views.render import run_notebooks

    (tmp_path / "nb" / "02_layer_drilldown.ipynb").write_text(json.dumps(broken))
    errors = run_notebooks(["02_layer_drilldown"], out, params, True, ROOT, notebook_dir=tmp_path / "nb")
    assert "02_layer_drilldown" in errors
    from driftscope.views.failure import pages_beside_the_verdict

    pages_beside_the_verdict(report, errors, print)
    assert Report.load(out).data["pages_failed"].keys() == {"02_layer_drilldown"}
    capsys.readouterr()
    assert main(["show", str(out)]) == 1
    assert "page 02\\_layer\\_drilldown failed" in capsys.readouterr().out


PARAMETER_FILES = sorted(path.name for path in (ROOT / "parameters").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("name", PARAMETER_FILES)
def test_every_parameter_file_runs_with_every_page_it_lists(name, tmp_path):
    """The run's exit code is its verdict's (0 pass, 1 fail), never 2 because a page failed, and every page it
    lists is rendered without an error."""
    path = ROOT / "parameters" / name
    listed = yaml.safe_load(path.read_text()).get("notebooks") or ["01_stage_parity"]
    out = tmp_path / "out"
    code = main(["run", str(path), "--out", str(out), "--no-gate"])
    report = Report.load(out)
    assert code == 0 and report.status == "complete", report.stopped()
    assert not report.data.get("pages_failed"), report.data.get("pages_failed")
    for notebook in listed:
        assert (out / f"{notebook}.html").exists(), notebook
