"""The compiled path's text decoder audited when it is read (issue 50 item 2): the emitters read the text side's
weights only at the text capture, so the load audit checks them there, under the family's
``LoadLayout.later["text"]`` (names without the prefix, Molmo2's fused projections split and its two embedding
tables stacked, Qwen3-VL-MoE's stacked experts in either on-disk layout, a tied head as the word embedding), into
the same record: a wrong read is the candidate's finding and stops the reference."""

from __future__ import annotations

import pytest
from conftest import ROOT
from driftscope.capture import load_audit
from driftscope.capture.runtime_checks import audit_checks
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, get_family
from driftscope.families.checkpoints import open_checkpoint
from driftscope.model.weightfile import TensorFiles
from driftscope.taps.stages import StagePlan
from make_tester_configs import get

IMAGE = ROOT / "fixtures" / "images" / "shapes_56.png"
COMPILED = [name for name in FAMILIES.names() if "jax" in get_family(name).engines]


def _runtime(path, policy: str = "f32"):
    runtime = get_runtime("jax")(open_checkpoint(path), policy)
    runtime.load()
    return runtime


def _text_capture(runtime, tmp_path):
    """``runtime``'s capture of the tower and one decoded token: its TapSet."""
    checkpoint = runtime.checkpoint
    family = get_family(checkpoint.family)
    inputs = family.prepare_inputs(checkpoint, [IMAGE])
    inputs.text = family.text_inputs(checkpoint, inputs, max_new_tokens=1)
    vision = family.vision_plan(checkpoint.config)
    plan = StagePlan(vision.family, vision.stages + family.text_stages(checkpoint.config, 1), vision.depth, vision.meta)
    return runtime.capture(inputs, plan, tmp_path / "taps")


@pytest.mark.parametrize("name", COMPILED)
def test_every_family_s_compiled_text_decoder_holds_what_its_checkpoint_holds(name, tmp_path):
    runtime = _runtime(get_family(name).tiny.ensure())
    tower = runtime.load_audit["checked"]
    assert runtime.load_audit.get("parts") is None  # nothing of the text side is held before the text capture
    record = _text_capture(runtime, tmp_path).meta["load_audit"]
    assert record["status"] == "pass", record["findings"]
    assert record["parts"] == ["text"]
    assert record["checked"] == tower + len(runtime.model.text_weights) > tower  # every text weight it holds


def test_a_text_side_held_in_float16_is_audited_at_float16(tmp_path):
    """``f16-contract`` reads the decoder's dot weights as float16 (``compiled_weights.half_weights``)."""
    runtime = _runtime(get_family("qwen2_5_vl").tiny.ensure(), "f16-contract")
    record = _text_capture(runtime, tmp_path).meta["load_audit"]
    assert record["status"] == "pass", record["findings"]
    assert {str(value.dtype) for value in runtime.model.text_weights.values()} == {"float16", "float32"}


def test_a_square_released_expert_is_read_right_by_the_emitter_and_audited(tmp_path):
    runtime = _runtime(get("tester-qwen3-vl-moe-transformers").ensure())  # 2 x moe_intermediate == hidden
    record = _text_capture(runtime, tmp_path).meta["load_audit"]
    assert record["status"] == "pass", record["findings"]
    experts = [name for name in runtime.model.text_weights if name.endswith((".mlp.gate_up", ".mlp.down"))]
    assert experts and any("released layout" in note for note in record["notes"])


def _misread(runtime, monkeypatch, tensor: str) -> None:
    """Make ``runtime``'s emitter read the text side as a loader that got ``tensor`` wrong (its first row negated);
    the audit, after the text capture, reads the checkpoint itself."""
    read, capture_text = TensorFiles.read, runtime.taps.capture_text

    def wrong(files, name):
        value = read(files, name)
        if name == tensor:
            value = value.copy()
            value[0] = -value[0]
        return value

    def misreading_capture_text(*args, **kwargs):
        with monkeypatch.context() as patched:
            patched.setattr(TensorFiles, "read", wrong)
            return capture_text(*args, **kwargs)

    monkeypatch.setattr(runtime.taps, "capture_text", misreading_capture_text)


@pytest.mark.parametrize("name", ["qwen2_5_vl", "molmo2"])
def test_a_text_weight_the_emitter_read_wrong_is_the_candidate_s_finding(name, tmp_path, monkeypatch):
    runtime = _runtime(get_family(name).tiny.ensure())
    files = TensorFiles(runtime.checkpoint.path)
    tensor = next(t for t in files.names() if t.endswith(("layers.0.self_attn.q_proj.weight", "att_proj.weight")))
    _misread(runtime, monkeypatch, tensor)
    tapset = _text_capture(runtime, tmp_path)
    record = tapset.meta["load_audit"]
    assert record["status"] == "fail" and len(record["findings"]) == 1
    held = "layers.0.self_attn.q_proj.weight" if name == "qwen2_5_vl" else "text.layers.0.attn.q.weight"
    assert record["findings"][0].startswith(held) and tensor in record["findings"][0]
    assert "values differ" in record["findings"][0]
    (check,) = audit_checks(tapset)
    assert check["status"] == "fail" and held in check["detail"]


def test_the_reference_s_wrong_text_read_stops_its_capture(tmp_path, monkeypatch):
    runtime = _runtime(get_family("qwen3_vl").tiny.ensure())
    runtime.strict_audit = True
    tensor = next(t for t in TensorFiles(runtime.checkpoint.path).names() if t.endswith("layers.1.mlp.up_proj.weight"))
    _misread(runtime, monkeypatch, tensor)
    with pytest.raises(load_audit.LoadAuditError) as caught:
        _text_capture(runtime, tmp_path)
    assert "layers.1.mlp.up_proj.weight" in caught.value.problem
