"""Engines that stopped, ran on other inputs, declare another policy, or wrote an unreadable file: each is that
runtime's failed check or "could not run", in report.json, ``driftscope show`` and notebook 01, while the
other runtimes are still compared."""

from __future__ import annotations

import html
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import ROOT, SHAPES, write_params
from driftscope.cli import main
from driftscope.taps.tapset import TapSet, TapWriter


def engine_copy(source: TapSet, base, stop_before: str | None = None, **meta) -> str:
    """The oracle's own values as an engine's TapSet with the sidecar fields ``meta`` (None drops a field)."""
    fields = {"runtime": "engine", "inputs_digest": source.meta["inputs_digest"], "policy": "f32", **meta}
    writer = TapWriter(base, {key: value for key, value in fields.items() if value is not None})
    for stage_id in source.stage_ids():
        if stage_id == stop_before:
            break
        keep = ("axes", "token_order", "token_unit", "integer", "native_dtype")
        writer.add(stage_id, source[stage_id], **{k: v for k, v in source.declaration(stage_id).items() if k in keep})
    writer.close(complete=stop_before is None, error="engine OOM at block 5" if stop_before else None)
    return str(writer.tensor_path)


@pytest.fixture(scope="module")
def checked_run(tmp_path_factory, captures):
    base = tmp_path_factory.mktemp("checks")
    oracle = captures["transformers:f32"]  # every stage of the tiny fixture on the shapes image
    bf16 = {"policy": {"name": "bf16"}}
    paths = {
        "good": engine_copy(oracle, base / "good"),
        "stopped": engine_copy(oracle, base / "stopped", stop_before="vision.block.5.norm1"),
        "no-digest": engine_copy(oracle, base / "no-digest", inputs_digest=None),
        "other-inputs": engine_copy(oracle, base / "other-inputs", inputs_digest="0123456789abcdef"),
        "bf16-engine": engine_copy(oracle, base / "bf16-engine", **bf16),
        "bf16-agreed": engine_copy(oracle, base / "bf16-agreed", **bf16),
        "unreadable": str(base / "unreadable.safetensors"),
    }
    (base / "unreadable.safetensors").write_bytes(b"\x00" * 64)
    (base / "unreadable.json").write_text(json.dumps({"format": "driftscope-tapset", "format_version": 1}))
    runtimes = ["transformers:f32"] + [
        {
            "runtime": "tapfile",
            "label": label,
            "options": {"path": path},
            **({"policy": "bf16"} if "agreed" in label else {}),
        }
        for label, path in paths.items()
    ]
    params = write_params(base / "p.yaml", "checks", runtimes, stages="all", replay=False, images=[str(SHAPES)])
    code = main(["run", str(params), "--out", str(base / "out")])
    return code, base / "out"


def test_each_engine_gets_its_own_verdict_and_the_others_are_compared(checked_run):
    code, out = checked_run
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "complete" and code == 2  # two engines could not run: the run is not judged
    assert report["verdict"]["status"] == "could not run"
    assert report["verdict"]["per_candidate"] == {
        "good": "pass",
        "stopped": "could not run",
        "no-digest": "fail",
        "other-inputs": "fail",
        "bf16-engine": "fail",
        "bf16-agreed": "pass",
        "unreadable": "could not run",
    }
    rows = [row for row in report["rows"] if row["candidate"] == "good"]
    assert len(rows) == len(report["stage_plan"]) and all(row["status"] == "pass" for row in rows)
    assert "unreadable" not in {row["candidate"] for row in report["rows"]}


def test_a_stopped_engine_could_not_run_and_its_error_is_shown(checked_run, capsys):
    _, out = checked_run
    report = json.loads((out / "report.json").read_text())
    stopped = {check["check"]: check for check in report["checks"]["stopped"]}
    assert stopped["complete"]["status"] == "could not run"
    assert "engine OOM at block 5" in stopped["complete"]["detail"]
    # the stages it wrote all pass: they never make a pass of the runtime
    written = [row for row in report["rows"] if row["candidate"] == "stopped" and row["status"] != "missing"]
    assert written and all(row["status"] == "pass" for row in written)
    assert any("stopped: could not run (its capture did not run to the end)" in r for r in report["verdict"]["reasons"])
    assert main(["show", str(out)]) == 2  # the run could not judge every runtime
    shown = capsys.readouterr().out
    assert "| `stopped vs transformers:f32` | could not run |" in shown and "engine OOM at block 5" in shown
    assert "| `unreadable` | could not run |" in shown and "not a readable safetensors file" in shown


def test_inputs_digest_missing_or_different_is_a_failed_check(checked_run):
    _, out = checked_run
    report = json.loads((out / "report.json").read_text())
    digest = report["inputs"]["digest"]
    checks = {label: {c["check"]: c for c in entries} for label, entries in report["checks"].items()}
    assert checks["good"]["inputs_digest"]["status"] == "pass"
    assert checks["no-digest"]["inputs_digest"]["status"] == "fail"
    assert "no inputs_digest" in checks["no-digest"]["inputs_digest"]["detail"]
    assert checks["other-inputs"]["inputs_digest"]["detail"].startswith(
        f"inputs_digest 0123456789abcdef is not this run's {digest}"
    )
    assert checks["transformers:f32"]["inputs_digest"]["status"] == "pass"


def test_the_engines_declared_policy_is_kept_and_must_agree_with_the_parameter_file(checked_run):
    _, out = checked_run
    report = json.loads((out / "report.json").read_text())
    runtimes = {entry["label"]: entry for entry in report["runtimes"]}
    assert runtimes["bf16-engine"]["policy"] == {"name": "bf16"}  # as declared, never "everything in float32"
    assert runtimes["bf16-engine"]["policy_label"] == "f32"
    policy = next(c for c in report["checks"]["bf16-engine"] if c["check"] == "policy")
    assert policy["status"] == "fail" and "parameter file says policy 'f32', the sidecar 'bf16'" in policy["detail"]
    assert next(c for c in report["checks"]["bf16-agreed"] if c["check"] == "policy")["status"] == "pass"
    assert runtimes["transformers:f32"]["policy"]["name"] == "f32"


def test_notebook_01_shows_the_checks(checked_run):
    _, out = checked_run
    page = html.unescape(re.sub(r"<[^>]+>", "", (out / "01_stage_parity.html").read_text()))
    for text in ("could not run", "engine OOM at block 5", "inputs_digest 0123456789abcdef is not this run's"):
        assert text in page, text


def test_rejudging_keeps_the_checks(checked_run, tmp_path):
    from driftscope.judge.contract import load_contract
    from driftscope.run.rejudge import rejudge

    _, out = checked_run
    again = rejudge(out / "report.json", load_contract(None), tmp_path / "again.json")
    assert again.data["verdict"]["per_candidate"]["stopped"] == "could not run"
    assert again.data["verdict"]["per_candidate"]["other-inputs"] == "fail"


def test_the_doc_states_exactly_what_the_digest_hashes(shapes_inputs):
    doc = (ROOT / "docs" / "tapfile.md").read_text()
    section = doc[doc.index("## 2. The inputs digest") : doc.index("## 3. Tensors")]
    code = section[section.index("```python\n") + 10 : section.index("```\n", section.index("```python"))]
    namespace: dict = {}
    exec(code, namespace)  # the doc's own recipe, against the digest driftscope computes
    digest = namespace["inputs_digest"]
    assert digest(shapes_inputs["pixel_values"], shapes_inputs["grid_thw"]) == shapes_inputs.digest
    ids = np.arange(7, dtype=np.int64)
    with_text = type(shapes_inputs)(**{**shapes_inputs.__dict__, "text": SimpleNamespace(input_ids=ids)})
    arrays = (shapes_inputs["pixel_values"], shapes_inputs["grid_thw"])
    assert digest(*arrays, ids) == with_text.digest != shapes_inputs.digest


@pytest.mark.parametrize("declared", ["f32", {"name": "f32"}, {"name": "f32", "activations": "float32"}])
def test_an_engine_that_computed_narrower_than_its_policy_fails_the_dtype_check(tmp_path, captures, declared):
    """Issue 30 item 4: an engine written from docs/tapfile.md (the example writer) stores BF16, declares
    ``native_dtype: bfloat16`` and ``policy: f32``: the f32 gate passed it. The policy's activation dtype comes
    from the registry when the sidecar only names it; computing narrower than it fails."""
    import importlib.util

    from driftscope.capture.runtime_checks import capture_checks

    spec = importlib.util.spec_from_file_location("tapfile_writer", ROOT / "examples" / "tapfile_writer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    oracle = captures["transformers:f32"]
    digest = oracle.meta["inputs_digest"]
    vision = [stage_id for stage_id in oracle.stage_ids() if stage_id.startswith("vision.block.")]

    def engine(name: str, store: str) -> TapSet:
        writer = example.TapSetWriter(str(tmp_path / name), "engine", policy=declared, inputs_digest=digest)
        native = {"BF16": "bfloat16", "F32": "float32"}[store]
        for stage_id in vision:
            writer.add(stage_id, np.asarray(oracle[stage_id]), store=store, native_dtype=native)
        writer.close()
        return TapSet(tmp_path / f"{name}.safetensors")

    def dtype_check(tapset: TapSet) -> dict:
        return next(c for c in capture_checks(tapset, digest, "f32") if c["check"] == "compute_dtype")

    narrow = dtype_check(engine("bf16-under-f32", "BF16"))
    assert narrow["status"] == "fail" and "bfloat16 is narrower" in narrow["detail"], narrow
    assert dtype_check(engine("f32", "F32"))["status"] == "pass"


def test_49_8_the_stored_dtype_decides_when_it_is_narrower_than_the_declared_one(tmp_path, captures):
    """Stages stored as BF16 whose sidecar declares ``native_dtype: float32`` hold bfloat16 values whatever it says:
    under ``policy: f32`` the check fails. So does a text stage stored narrower (the tower's stages in F32): every
    model stage counts, not the tower's alone."""
    import importlib.util

    from driftscope.capture.runtime_checks import capture_checks

    spec = importlib.util.spec_from_file_location("tapfile_writer", ROOT / "examples" / "tapfile_writer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    oracle = captures["transformers:f32"]
    digest = oracle.meta["inputs_digest"]
    vision = [stage_id for stage_id in oracle.stage_ids() if stage_id.startswith("vision.block.")][:4]

    def engine(name: str, stores: dict[str, str]) -> TapSet:
        writer = example.TapSetWriter(str(tmp_path / name), "engine", policy="f32", inputs_digest=digest)
        for stage_id, store in stores.items():
            value = np.asarray(oracle[stage_id]) if stage_id in oracle else np.linspace(-1, 1, 24).reshape(2, 12)
            writer.add(stage_id, value, store=store, native_dtype="float32")  # the sidecar says float32 always
        writer.close()
        return TapSet(tmp_path / f"{name}.safetensors")

    def dtype_check(tapset: TapSet) -> dict:
        return next(c for c in capture_checks(tapset, digest, "f32") if c["check"] == "compute_dtype")

    lying = dtype_check(engine("stored-bf16", dict.fromkeys(vision, "BF16")))
    assert lying["status"] == "fail" and "bfloat16 is narrower" in lying["detail"], lying
    text = dtype_check(engine("text-bf16", {**dict.fromkeys(vision, "F32"), "text.logits.last": "BF16"}))
    assert text["status"] == "fail" and "bfloat16" in text["detail"], text
    assert dtype_check(engine("honest", dict.fromkeys(vision, "F32")))["status"] == "pass"


def test_a_check_that_did_not_pass_is_said_in_words_in_the_reasons():
    """ "mlx:f32: could not run (it did not load): ..." where the reasons once read "loaded could not run: ..."."""
    from driftscope.capture.runtime_checks import apply_checks, check

    data = {"verdict": {"status": "pass", "per_candidate": {}, "reasons": []}, "pairs": []}
    checks = {
        "mlx:f32": [check("loaded", "could not run", "ImportError: no module named mlx")],
        "ext": [check("inputs_digest", "fail", "inputs_digest abc is not this run's def: other inputs")],
    }
    apply_checks(data, checks)
    reasons = data["verdict"]["reasons"]
    assert "mlx:f32: could not run (it did not load): ImportError: no module named mlx" in reasons
    assert not any("loaded could not run" in reason for reason in reasons)
    assert "ext: it ran on other inputs (fail): inputs_digest abc is not this run's def: other inputs" in reasons
