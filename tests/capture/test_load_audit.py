"""The load audit (``capture.load_audit``, issue 50 item 2): every parameter a runtime loaded equals the
checkpoint's tensor under the transform its family declares, checked before any capture.

transformers 5.24 decides whether to transpose a stacked expert by its shape alone, so it keeps a square one of the
released layout untransposed: transformers' own MoE tester config (``2 x moe_intermediate == hidden``) is read
wrongly by the reference, silently. The audit names the tensor: on the reference it stops the run, on a candidate
it is that candidate's finding. The family's correction (``qwen3_vl_moe.held.correct_transformers``) puts it
right, and says so."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import ROOT
from driftscope.capture import load_audit
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, get_family
from driftscope.families.checkpoints import open_checkpoint
from make_tester_configs import get

SQUARE = "tester-qwen3-vl-moe-transformers"  # 2 x moe_intermediate 16 == hidden 32
GATE_UP = "model.language_model.layers.0.mlp.experts.gate_up_proj"
IMAGE = ROOT / "fixtures" / "images" / "shapes_56.png"


def _loaded(path, runtime: str = "transformers", **options):
    runtime = get_runtime(runtime)(open_checkpoint(path), "f32", None, options)
    runtime.load()
    return runtime


@pytest.mark.parametrize("runtime_name", ["transformers", "mlx", "jax"])
@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_runtime_of_every_family_holds_what_its_checkpoint_holds(name, runtime_name):
    family = get_family(name)
    if runtime_name not in family.engines:
        pytest.skip(f"{name} has no {runtime_name} engine")
    runtime = _loaded(family.tiny.ensure(), runtime_name)
    record = runtime.load_audit
    assert record["status"] == "pass", record.get("findings") or record["detail"]  # every family declares a layout
    assert record["checked"] == len(runtime.loaded_tensors()) > 0
    runtime.release()


def test_a_square_released_expert_transformers_left_untransposed_is_named():
    path = get(SQUARE).ensure()
    assert json.loads((path / "config.json").read_text())["transformers_version"].startswith("4.")  # released
    raw = _loaded(path, load_fixes=False)
    record = raw.load_audit
    assert record["status"] == "fail"
    assert any(finding.startswith(f"{GATE_UP}: ") and "values differ" in finding for finding in record["findings"])
    assert "transpose" in record["detail"]
    fixed = _loaded(path)
    assert fixed.load_audit["status"] == "pass" and GATE_UP in fixed.load_audit["corrected"]
    # independently of the declaration: the corrected expert is the checkpoint's transposed, the raw one is not
    from safetensors.numpy import load_file

    stored = load_file(str(path / "model.safetensors"))[GATE_UP]
    held = dict(fixed.model.named_parameters())[GATE_UP].detach().numpy()
    np.testing.assert_array_equal(held, stored.transpose(0, 2, 1))
    assert not np.array_equal(dict(raw.model.named_parameters())[GATE_UP].detach().numpy(), held)


def test_the_reference_stops_before_any_capture_naming_the_tensor():
    runtime = get_runtime("transformers")(open_checkpoint(get(SQUARE).ensure()), "f32", None, {"load_fixes": False})
    runtime.strict_audit = True
    with pytest.raises(load_audit.LoadAuditError) as caught:
        runtime.load()
    assert GATE_UP in caught.value.problem and "did not load what the checkpoint holds" in caught.value.problem


def _params(tmp_path, runtimes) -> str:
    path = tmp_path / "p.yaml"
    data = {
        "name": "load-audit",
        "checkpoint": str(get(SQUARE).ensure()),
        "images": [str(IMAGE)],
        "runtimes": runtimes,
        "replay": False,
        "notebooks": ["01_stage_parity"],
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_run_whose_reference_did_not_load_its_checkpoint_could_not_run(tmp_path):
    from driftscope.cli import main
    from driftscope.run.report import Report

    raw = {"runtime": "transformers", "label": "raw", "options": {"load_fixes": False}}
    out = tmp_path / "out"
    assert main(["run", _params(tmp_path, [raw, "mlx:f32"]), "--out", str(out)]) == 2
    report = Report.load(out)
    assert report.status != "complete" and GATE_UP in report.data["error"]["message"]


def test_a_candidate_that_did_not_load_its_checkpoint_is_its_finding(tmp_path):
    from driftscope.cli import main
    from driftscope.run.report import Report

    raw = {"runtime": "transformers", "label": "raw", "options": {"load_fixes": False}}
    out = tmp_path / "out"
    assert main(["run", _params(tmp_path, ["transformers:f32", raw, "mlx:f32"]), "--out", str(out)]) == 1
    report = Report.load(out)
    (audited,) = [c for c in report.data["checks"]["raw"] if c["check"] == "load_audit"]
    assert audited["status"] == "fail" and GATE_UP in audited["detail"]
    assert report.data["verdict"]["per_candidate"]["raw"] == "fail"
    assert report.data["verdict"]["per_candidate"]["mlx:f32"] == "pass"  # MLX reads the released layout right
    assert any("raw: it did not load what its checkpoint holds" in r for r in report.data["verdict"]["reasons"])


def test_a_large_tensor_is_checked_on_sampled_rows_and_a_wrong_row_is_still_found(monkeypatch):
    monkeypatch.setattr(load_audit, "FULL_ELEMENTS", 1024)  # every matrix of the tiny checkpoint counts as large
    runtime = _loaded(get_family("qwen3_vl").tiny.ensure())
    record = runtime.load_audit
    assert record["status"] == "pass" and record["sampled"]["tensors"] > 10
    name = "model.language_model.layers.1.mlp.down_proj.weight"
    param = dict(runtime.model.named_parameters())[name]
    rows = load_audit._sampled(tuple(param.shape), load_audit.Held())
    assert rows is not None and 0 < len(rows) < param.shape[0]
    import torch

    with torch.no_grad():
        param[int(rows[1])] += 1.0  # what a loader that misplaced one row would hold
    again = load_audit.audit(runtime)
    assert again["status"] == "fail" and any(finding.startswith(name) for finding in again["findings"])
