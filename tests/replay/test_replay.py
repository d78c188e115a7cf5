"""Same-input replay: op-local errors, introduced/inherited labels, error maps, precision experiments."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, SHAPES, shared_tapset
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import stage_plan
from driftscope.families.checkpoints import prepare_inputs
from driftscope.families.qwen2_5_vl.plan import ReplayContext
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import load_contract
from driftscope.replay import drill_down
from driftscope.taps.stages import StageSelection

MASSIVE = ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl-massive"


@pytest.fixture(scope="module")
def oracle(captures):
    return captures["transformers:f32"]


def test_replaying_the_oracle_on_its_own_taps_reproduces_them(tiny_checkpoint, oracle, full_plan, tmp_path):
    """Replay fidelity: the oracle's operators fed its own inputs give its own outputs, bit for bit."""
    runtime = get_runtime("transformers")(tiny_checkpoint)
    ctx = ReplayContext.from_tapset(oracle, [3, 7])
    for stage in (
        "vision.block.0",
        "vision.block.3",
        "vision.block.5.attn.context",
        "vision.block.7.mlp.down",
        "vision.merger.hidden",
    ):
        from driftscope.families.qwen2_5_vl.plan import replay_inputs

        inputs = [ctx.stage(oracle, name) for name in replay_inputs(stage, 8)]
        assert np.array_equal(runtime.replay(stage, inputs, ctx), np.asarray(oracle[stage])), stage


@pytest.mark.parametrize("name,policy", [("mlx", "f32"), ("jax", "f32"), ("iree", "f32"), ("mlx", "f16")])
def test_op_local_errors_of_each_candidate(tiny_checkpoint, shapes_inputs, oracle, full_plan, tmp_path, name, policy):
    runtime = get_runtime(name)(tiny_checkpoint, policy)
    # the same capture as conftest's ``captures`` (MLX) and test_compiled's ``compiled_captures`` (JAX, IREE): made
    # once per test run; the replay below loads the runtime where another test captured
    candidate = shared_tapset(f"captures/{name}-{policy}", lambda out: runtime.capture(shapes_inputs, full_plan, out))
    contract = load_contract(None)
    accumulated = compare_tapsets(oracle, candidate, contract, full_plan)
    drill = drill_down(oracle, runtime, accumulated, contract, full_plan, tmp_path / "replay", name)
    replayed = {row.stage: row for row in drill.rows}
    # every block and substage, the patch embedding, the rotary tables and every merger operator (issue 21 item 2)
    stem = ["vision.patch_embed", "vision.rotary.cos", "vision.rotary.sin"]
    merger = ["vision.merger.norm", "vision.merger.hidden", "vision.merger.window", "vision.merger"]
    assert len(replayed) == 8 * 14 + len(stem) + len(merger) and set(stem + merger) <= set(replayed)
    acc = {row.stage: row for row in accumulated}
    if policy == "f32":
        assert max(row.max_abs for row in drill.rows) < 1e-4
        assert {label["label"] for label in drill.labels} == {"clean"}
    else:
        # f16 operators add error of their own, far less than the error accumulated by block 7
        assert replayed["vision.block.0"].relative_rms > 1e-4
        assert replayed["vision.block.7"].relative_rms < acc["vision.block.7"].relative_rms / 2
        assert drill.first_introduced is None


def test_a_perturbed_block_is_introduced_and_later_blocks_inherit(
    tiny_checkpoint, shapes_inputs, oracle, full_plan, tmp_path
):
    patch = parse_patch({"callable": "driftscope.hypotheses:scale_block_output", "kwargs": {"block": 5, "factor": 1.5}})
    runtime = get_runtime("mlx")(tiny_checkpoint, "f32", patch)
    candidate = runtime.capture(shapes_inputs, full_plan, tmp_path / "run")
    contract = load_contract(None)
    accumulated = compare_tapsets(oracle, candidate, contract, full_plan)
    drill = drill_down(oracle, runtime, accumulated, contract, full_plan, tmp_path / "replay", "mlx:f32")
    labels = {label["stage"]: label["label"] for label in drill.labels}
    assert drill.first_introduced == "vision.block.5"
    assert [labels[f"vision.block.{b}"] for b in range(8)] == ["clean"] * 5 + ["introduced", "inherited", "inherited"]
    assert all(labels[f"vision.block.5.{s}"] == "clean" for s in ("norm1", "attn.q", "mlp.down"))  # inside: fine


def test_massive_activation_collapses_rows_under_manual_f16_rmsnorm(tmp_path):
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.views.errormaps import StageDifference, collapsed_rows, top_channels

    if not (MASSIVE / "model.safetensors").exists():
        from make_tiny_qwen25vl import main

        main([str(MASSIVE.with_name("tiny-qwen2_5-vl"))])
    checkpoint = open_checkpoint(MASSIVE)
    inputs = prepare_inputs(checkpoint, [SHAPES])
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection(True, (0,)))
    oracle = get_runtime("transformers")(checkpoint).capture(inputs, plan, tmp_path / "oracle")
    stage = "vision.block.0.norm1"
    results = {}
    for form in ("fused", "manual"):
        run = get_runtime("mlx")(checkpoint, "f16", options={"rmsnorm": form}).capture(inputs, plan, tmp_path / form)
        difference = StageDifference(
            stage, np.asarray(oracle[stage]), np.asarray(run[stage]), 0.08, 0.08, "window", [(0, 1024)]
        )
        results[form] = (collapsed_rows(difference), top_channels(difference, 3))
    assert results["fused"][0] == 0
    assert results["manual"][0] > 100  # rows whose squares overflowed F16: all zero where the oracle is not
    assert int(results["manual"][1]["channel"].iloc[0]) == 17  # the planted channel leads the channel map


def test_relative_verdict_against_float64(tiny_checkpoint, shapes_inputs, captures, tmp_path):
    from driftscope.judge.relative import relative_verdict
    from driftscope.taps.stages import StageSelection as Selection

    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(Selection())
    high = get_runtime("transformers")(tiny_checkpoint, "f64").capture(shapes_inputs, plan, tmp_path / "f64")
    verdict = relative_verdict(
        high, captures["transformers:f32"], [captures["mlx:f32"], captures["mlx:f16"]], plan, factor=4.0, floor=1e-6
    )
    assert verdict["candidates"]["mlx:f32"]["status"] == "pass"
    assert verdict["candidates"]["mlx:f16"]["status"] == "fail"
    assert verdict["candidates"]["mlx:f16"]["first_failure"] == "vision.patch_embed"
    stages = {s["stage"]: s for s in verdict["candidates"]["mlx:f32"]["stages"]}
    assert 0 < stages["vision.block.7"]["oracle_rmse"] < 1e-5  # the oracle's own float32 error is real, and small


def test_peer_relative_verdict(captures, full_plan):
    """mlx:f16 judged by its error against the oracle relative to mlx:f32's (the trusted peer's), with the factor
    declared per stage pattern in the contract."""
    from driftscope.judge.contract import Contract
    from driftscope.judge.relative import peer_verdict

    oracle = captures["transformers:f32"]
    rows = []
    for label in ("mlx:f32", "mlx:f16"):
        rows += compare_tapsets(oracle, captures[label], load_contract(None), full_plan)
    verdict = peer_verdict(rows, "transformers:f32", "mlx:f32", load_contract(None), full_plan)
    assert list(verdict["candidates"]) == ["mlx:f16"]
    f16 = verdict["candidates"]["mlx:f16"]
    assert f16["status"] == "fail" and f16["first_failure"] == "vision.patch_embed"
    stages = {entry["stage"]: entry for entry in f16["stages"]}
    assert "inputs.pixel_values" not in stages and "vision.window_index" not in stages  # data: exact, not relative
    block = stages["vision.block.7"]
    rmse = {
        label: float(
            np.sqrt(
                np.mean((np.asarray(captures[label]["vision.block.7"], np.float64) - oracle["vision.block.7"]) ** 2)
            )
        )
        for label in ("mlx:f32", "mlx:f16")
    }
    assert block["peer_rmse"] == pytest.approx(rmse["mlx:f32"], rel=1e-6)
    assert block["candidate_rmse"] == pytest.approx(rmse["mlx:f16"], rel=1e-6)
    assert block["bound"] == pytest.approx(4.0 * rmse["mlx:f32"] + 1e-6) and block["status"] == "fail"
    generous = Contract.from_dict({"stages": [{"pattern": "vision.*", "peer_factor": 1000, "peer_floor": 1.0}]})
    assert (
        peer_verdict(rows, "transformers:f32", "mlx:f32", generous, full_plan)["candidates"]["mlx:f16"]["status"]
        == "pass"
    )
