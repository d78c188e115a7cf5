"""``text.rope_delta``: the M-RoPE offset each Qwen decoder actually placed its generated tokens with, read from
the decoder's own state after the decode, compared exactly like the prompt's integer stages."""

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
    # every runtime's decoder used the delta the geometry library gives; the prompt's delta stays right
    assert np.asarray(oracle["text.rope_delta"]).tolist() == [delta]
    assert np.asarray(report.tapset("mlx:f32")["text.rope_delta"]).tolist() == [delta]
    assert rows[("mlx:f32", "text.rope_delta")].status == "pass"
    assert np.asarray(report.tapset("mlx-shifted")["text.rope_delta"]).tolist() == [delta + 2]
    assert rows[("mlx-shifted", "text.rope_deltas")].status == "pass"
    shifted = rows[("mlx-shifted", "text.rope_delta")]
    assert shifted.status == "fail" and shifted.failures == 1
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
    assert np.asarray(oracle["text.rope_delta"]).tolist() == np.asarray(oracle["text.rope_deltas"]).tolist()
    patch = parse_patch({"callable": PLANTED, "kwargs": {"shift": 2}})
    runtime = get_runtime("mlx")(checkpoint, "f32", patch)
    candidate = runtime.capture(inputs, plan, tmp_path / "mlx")
    runtime.release()
    expected = (np.asarray(oracle["text.rope_delta"]) + 2).tolist()
    assert np.asarray(candidate["text.rope_delta"]).tolist() == expected
    rows = {row.stage: row for row in compare_tapsets(oracle, candidate, load_contract(DEFAULT), plan)}
    assert rows["text.rope_delta"].status == "fail" and rows["text.rope_delta"].failures == 1
    assert rows["text.rope_deltas"].status == "pass" and rows["text.logits.last"].status == "pass"
