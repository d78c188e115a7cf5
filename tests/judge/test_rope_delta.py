"""``text.rope_delta``: the M-RoPE offset each Qwen decoder actually applied to each generated token, read from
the positions its layers were given in every decode step (not from the delta it stores), compared exactly like the
prompt's integer stages."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, SHAPES, TINY
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, get_family
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import load_contract
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters

PLANTED = str(ROOT / "tests" / "planted_patches.py") + ":shift_decode_rope_delta"
DEFAULT = ROOT / "parameters" / "contracts" / "default.yaml"


def _params(runtimes):
    data = {
        "name": "rope-delta",
        "checkpoint": str(TINY),
        "images": [str(SHAPES)],
        "runtimes": runtimes,
        "stages": {"blocks": False},
        "replay": False,
        "text": {"max_new_tokens": 6},
    }
    return parse_parameters(data, "test")


def test_a_decode_delta_off_by_two_in_mlx_is_found_at_the_rope_delta_stage(tmp_path, tiny_checkpoint_dir):
    from driftscope.families.qwen2_5_vl.geometry import mrope_positions

    planted = {"runtime": "mlx", "label": "mlx-shifted", "patch": {"callable": PLANTED, "kwargs": {"shift": 2}}}
    report = investigate(_params(["transformers:f32", "mlx:f32", planted]), tmp_path)
    rows = {(r.candidate, r.stage): r for r in report.rows}
    oracle = report.tapset("transformers:f32")
    ids = np.asarray(oracle["text.input_ids"])
    _, delta = mrope_positions((ids == 6).astype(int).tolist(), report.data["inputs"]["grid_thw"])
    # every runtime's decoder used the delta the geometry library gives, in each of its 5 decode steps; the
    # prompt's delta stays right
    assert np.asarray(oracle["text.rope_delta"]).tolist() == [delta] * 5
    assert np.asarray(report.tapset("mlx:f32")["text.rope_delta"]).tolist() == [delta] * 5
    assert rows[("mlx:f32", "text.rope_delta")].status == "pass"
    assert np.asarray(report.tapset("mlx-shifted")["text.rope_delta"]).tolist() == [delta + 2] * 5
    assert rows[("mlx-shifted", "text.rope_deltas")].status == "pass"
    shifted = rows[("mlx-shifted", "text.rope_delta")]
    assert shifted.status == "fail" and shifted.failures == 5
    # the prefill is untouched: the first failing stage is the decode's offset, before the decode stages
    assert rows[("mlx-shifted", "text.logits.last")].status == "pass"
    assert report.data["first_divergence"]["mlx-shifted"]["stage"] == "text.rope_delta"


@pytest.mark.parametrize("name", [n for n in FAMILIES.names() if "mlx" in get_family(n).engines])
def test_every_qwen_familys_mlx_decode_offset_is_read_from_the_decoder(name, tiny, runs, tmp_path):
    """Each family with an M-RoPE decode offset: transformers' is the prompt's delta, and MLX's planted one
    (off by 2) shows at ``text.rope_delta`` alone while the prompt's ``text.rope_deltas`` and the prefill pass."""
    checkpoint, inputs, plan = tiny(name)
    if "text.rope_delta" not in plan:
        pytest.skip(f"{name} has no M-RoPE decode offset")
    _, oracle = runs(name, "transformers")
    steps = np.asarray(oracle["text.rope_delta"]).tolist()
    assert steps == np.asarray(oracle["text.rope_deltas"]).tolist() * len(steps) and len(steps) >= 1
    patch = parse_patch({"callable": PLANTED, "kwargs": {"shift": 2}})
    runtime = get_runtime("mlx")(checkpoint, "f32", patch)
    candidate = runtime.capture(inputs, plan, tmp_path / "mlx")
    runtime.release()
    expected = (np.asarray(oracle["text.rope_delta"]) + 2).tolist()
    assert np.asarray(candidate["text.rope_delta"]).tolist() == expected
    rows = {row.stage: row for row in compare_tapsets(oracle, candidate, load_contract(DEFAULT), plan)}
    assert rows["text.rope_delta"].status == "fail" and rows["text.rope_delta"].failures == len(expected)
    assert rows["text.rope_deltas"].status == "pass" and rows["text.logits.last"].status == "pass"


@pytest.mark.parametrize("runtime_name", ["transformers", "mlx", "jax"])
def test_every_runtime_records_the_offset_of_each_decode_step(runtime_name, runs, tiny):
    """One offset per decode step (steps 1 .. N-1: the last token is never fed), each the prompt's delta."""
    _, tapset = runs("qwen2_5_vl", runtime_name)
    _, inputs, _ = tiny("qwen2_5_vl")
    delta = int(np.asarray(tapset["text.rope_deltas"]).reshape(-1)[0])
    assert np.asarray(tapset["text.rope_delta"]).tolist() == [delta] * (inputs.text.max_new_tokens - 1)


def test_a_fault_in_applying_a_rightly_stored_delta_is_found_at_its_step(tiny, runs, tmp_path):
    """mlx-vlm's decoder keeps the right stored delta but gives its layers positions one too late from decode step 3
    on (planted_patches.misapply_decode_rope_delta): the stored delta would pass; what the layers used does not,
    from step 3."""
    checkpoint, inputs, plan = tiny("qwen2_5_vl")
    _, oracle = runs("qwen2_5_vl", "transformers")
    misapplied = str(ROOT / "tests" / "planted_patches.py") + ":misapply_decode_rope_delta"
    patch = parse_patch({"callable": misapplied, "kwargs": {"shift": 1, "from_step": 3}})
    runtime = get_runtime("mlx")(checkpoint, "f32", patch)
    candidate = runtime.capture(inputs, plan, tmp_path / "mlx")
    stored = int(np.asarray(runtime.model.language_model._rope_deltas).reshape(-1)[0])
    runtime.release()
    delta = int(np.asarray(oracle["text.rope_deltas"]).reshape(-1)[0])
    assert stored == delta  # what mlx-vlm stores is right
    applied = np.asarray(candidate["text.rope_delta"]).tolist()
    assert applied == [delta, delta, delta + 1][: len(applied)]  # steps 1, 2 right, step 3 one late
    row = next(
        r for r in compare_tapsets(oracle, candidate, load_contract(DEFAULT), plan) if r.stage == "text.rope_delta"
    )
    assert row.status == "fail" and row.max_coords == [2]  # step 3
