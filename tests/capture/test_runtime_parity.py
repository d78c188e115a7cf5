"""MLX against the transformers oracle on the tiny fixture, stage by stage."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.families import stage_plan
from driftscope.judge.compare import compare_tapsets, first_divergence
from driftscope.judge.contract import Contract
from driftscope.taps.stages import StageSelection

TINY_PLAN_IDS = [
    s.id for s in stage_plan("qwen2_5_vl", {"vision_config": {"depth": 8}}).select(StageSelection.everything())
]


@pytest.fixture(scope="module")
def f32_rows(captures, full_plan):
    rows = compare_tapsets(captures["transformers:f32"], captures["mlx:f32"], Contract(), full_plan)
    return {row.stage: row for row in rows}


def test_every_stage_is_captured_by_both(captures, full_plan):
    for label in ("transformers:f32", "mlx:f32"):
        assert sorted(captures[label].stage_ids()) == sorted(full_plan.ids()), label


@pytest.mark.parametrize("stage_id", TINY_PLAN_IDS)
def test_mlx_f32_matches_the_oracle(f32_rows, stage_id):
    row = f32_rows[stage_id]
    assert row.status == "pass", row
    assert row.max_abs < 1e-4, (stage_id, row.max_abs)
    assert row.elements > 0


def test_stage_shapes_follow_the_declared_axes(captures, tiny_checkpoint):
    vision = tiny_checkpoint.config["vision_config"]
    taps = captures["mlx:f32"]
    patches = 32 * 32
    heads, hidden = vision["num_heads"], vision["hidden_size"]
    assert taps.shape("vision.block.3.attn.q") == (patches, heads, hidden // heads)
    assert taps.shape("vision.block.3.mlp.act") == (patches, vision["intermediate_size"])
    assert taps.shape("vision.merger") == (patches // 4, vision["out_hidden_size"])
    assert taps.shape("vision.window_index") == (patches // 4,)


def test_mlx_f16_drifts_and_the_report_says_where_it_starts(captures, full_plan):
    from driftscope.judge.verdict import judge

    verdict = judge(captures["transformers:f32"], [captures["mlx:f16"]], Contract(), full_plan)
    rows = {row["stage"]: row for row in verdict["rows"]}
    assert rows["vision.merger"]["relative_rms"] > 1e-4  # measurable: f32 round-off is ~1e-7
    assert rows["vision.merger"]["max_abs"] > 1e-3
    assert verdict["drift_onset"]["mlx:f16"] == "vision.patch_embed"  # the first op computed in f16
    assert rows["inputs.pixel_values"]["max_abs"] == 0.0  # both received the same processor output


def test_transformers_block_taps_equal_its_own_hidden_states(captures, tiny_checkpoint, shapes_inputs):
    """The hooks record what transformers itself reports as each block's output."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(tiny_checkpoint.path), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = model.model.visual(
            torch.from_numpy(shapes_inputs["pixel_values"]),
            torch.from_numpy(shapes_inputs["grid_thw"]),
            output_hidden_states=True,
        )
    taps = captures["transformers:f32"]
    for index, hidden in enumerate(out.hidden_states[1:]):
        np.testing.assert_array_equal(taps[f"vision.block.{index}"], hidden.numpy())
    np.testing.assert_array_equal(taps["vision.merger"], out.pooler_output.numpy())


@pytest.mark.parametrize("runtime", ["transformers:f32", "mlx:f32"])
def test_substages_compose_like_the_block(captures, tiny_checkpoint, runtime):
    """Independent numpy arithmetic over the taps and the checkpoint weights reproduces each substage."""
    from safetensors.numpy import load_file

    weights = load_file(str(tiny_checkpoint.path / "model.safetensors"))
    taps = captures[runtime]
    block = 5
    prefix = f"visual.blocks.{block}"
    block_in = taps[f"vision.block.{block - 1}"].astype(np.float64)
    norm_w = weights[f"{prefix}.norm1.weight"].astype(np.float64)
    expected_norm1 = block_in / np.sqrt((block_in**2).mean(-1, keepdims=True) + 1e-6) * norm_w
    np.testing.assert_allclose(taps[f"vision.block.{block}.norm1"], expected_norm1, atol=2e-5)
    residual = block_in + taps[f"vision.block.{block}.attn.out"]
    np.testing.assert_allclose(taps[f"vision.block.{block}.residual1"], residual, atol=2e-5)
    gate = taps[f"vision.block.{block}.mlp.gate"].astype(np.float64)
    act = gate / (1 + np.exp(-gate))
    np.testing.assert_allclose(taps[f"vision.block.{block}.mlp.act"], act, atol=2e-5)
    np.testing.assert_allclose(
        taps[f"vision.block.{block}.mlp.product"], act * taps[f"vision.block.{block}.mlp.up"], atol=2e-5
    )
    down_w = weights[f"{prefix}.mlp.down_proj.weight"].astype(np.float64)
    down_b = weights[f"{prefix}.mlp.down_proj.bias"].astype(np.float64)
    expected_down = taps[f"vision.block.{block}.mlp.product"] @ down_w.T + down_b
    np.testing.assert_allclose(taps[f"vision.block.{block}.mlp.down"], expected_down, atol=5e-5)
    np.testing.assert_allclose(taps[f"vision.block.{block}"], residual + expected_down, atol=5e-5)


def test_tapped_forward_equals_the_plain_forward(tiny_checkpoint, shapes_inputs, captures):
    from driftscope.capture.runtimes import get_runtime

    mlx = get_runtime("mlx")(tiny_checkpoint, "f32")
    np.testing.assert_array_equal(np.array(mlx.run_vision(shapes_inputs)), captures["mlx:f32"]["vision.merger"])
    oracle = get_runtime("transformers")(tiny_checkpoint, "f32")
    np.testing.assert_array_equal(
        oracle.run_vision(shapes_inputs).numpy(), captures["transformers:f32"]["vision.merger"]
    )


def test_hypothesis_patch_on_one_block_is_the_first_divergence(
    tmp_path, tiny_checkpoint, shapes_inputs, captures, full_plan
):
    from driftscope.capture.patches import HypothesisPatch
    from driftscope.capture.runtimes import get_runtime

    patch = HypothesisPatch("driftscope.hypotheses:scale_block_output", {"block": 5, "factor": 1.2})
    runtime = get_runtime("mlx")(tiny_checkpoint, "f32", patch)
    patched = runtime.capture(shapes_inputs, full_plan, tmp_path / "patched")
    rows = compare_tapsets(captures["transformers:f32"], patched, Contract(), full_plan)
    divergence = first_divergence(rows)
    assert divergence is not None
    assert divergence.stage == "vision.block.5"  # its substages still pass: the patch scales the output
    assert all(row.status == "pass" for row in rows if row.stage.startswith("vision.block.4"))
    assert patched.meta["patch"]["target"] == "driftscope.hypotheses:scale_block_output"
