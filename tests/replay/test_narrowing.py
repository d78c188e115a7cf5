"""Narrowing: a planted defect in one operator is named with block taps alone; re-runs from stored inputs
reproduce the forward; the bf16 drift ends with the accumulation verdict; rejudging keeps the narrowed stages."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHAPES, TINY
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import get_family, stage_plan
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import Contract, load_contract
from driftscope.replay.narrowing import Side, judge_pair
from driftscope.replay.recapture import FORWARD, RERUN, rerun_from_stored, targeted_forward
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters
from driftscope.run.rejudge import rejudge
from driftscope.taps.stages import StageSelection

#: stage with a planted defect -> the runtime it is planted in (transformers keeps the MLP's activation a module)
PLANTED = {
    "vision.patch_embed": "mlx",
    "vision.block.3.attn.context": "mlx",  # a full-attention block
    "vision.block.1.mlp.act": "transformers",
    "vision.block.6.norm2": "mlx",
    "vision.merger.hidden": "mlx",
}
#: every other operator kind (slow): norms, q/k/v, attention output, MLP pieces, merger pieces
MORE = {
    "vision.block.0.norm1": "mlx",
    "vision.block.1.attn.q": "mlx",
    "vision.block.2.attn.k": "mlx",
    "vision.block.4.attn.v": "mlx",
    "vision.block.5.attn.out": "mlx",
    "vision.block.7.mlp.gate": "mlx",
    "vision.block.0.mlp.up": "mlx",
    "vision.block.2.mlp.down": "mlx",
    "vision.merger.norm": "mlx",
    "vision.merger.window": "mlx",
}


def planted(stage: str, runtime: str, factor: float = 1.5) -> dict:
    patch = {"callable": "driftscope.hypotheses:plant_defect", "kwargs": {"stage": stage, "factor": factor}}
    return {"runtime": runtime, "policy": "f32", "label": stage, "patch": patch}


def run(cases: dict, out, extra=(), **more):
    runtimes = ["transformers:f32", *[planted(stage, runtime) for stage, runtime in cases.items()], *extra]
    data = {
        "name": "narrowing",
        "checkpoint": str(TINY),
        "images": [str(SHAPES)],
        "runtimes": runtimes,
        "stages": {"blocks": True},  # no substages asked for
        "notebooks": [],
        **more,
    }
    return investigate(parse_parameters(data, "test"), out)


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory, tiny_checkpoint_dir):
    out = tmp_path_factory.mktemp("planted")
    return run(PLANTED, out, extra=["mlx:bf16"]), out


@pytest.mark.parametrize("stage", sorted(PLANTED))
def test_a_planted_defect_is_named_with_block_taps_alone(planted_run, stage):
    report, _ = planted_run
    replay = report.data["replay"][stage]
    assert replay["first_introduced"] == stage
    assert report.data["first_divergence"][stage]["stage"] == stage
    conclusion = report.data["conclusions"][stage]
    assert conclusion["kind"] == "introduced" and conclusion["stage"] == stage
    assert conclusion["text"].startswith(f"{stage} introduces the error")
    block = stage.split(".")[2] if stage.startswith("vision.block.") else None
    narrowing = report.data["narrowing"].get(stage)
    if block is None:  # the stem and the merger's pieces are always captured: nothing to narrow
        assert narrowing is None
    else:
        assert [step["target"] for step in narrowing["steps"]] == [f"vision.block.{block}"]
        assert narrowing["added"] == [f"vision.block.{block}.{s}" for s in SUBSTAGES]
        assert {narrowing["steps"][0]["reference"], narrowing["steps"][0]["candidate"]} == {RERUN}
        labels = {label["stage"]: label["label"] for label in replay["labels"]}
        before = SUBSTAGES[: SUBSTAGES.index(stage.split(".", 3)[3])]
        assert all(labels[f"vision.block.{block}.{s}"] == "clean" for s in before)


SUBSTAGES = [
    "norm1",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.context",
    "attn.out",
    "residual1",
    "norm2",
    "mlp.gate",
    "mlp.act",
    "mlp.up",
    "mlp.product",
    "mlp.down",
]


def test_the_bf16_drift_ends_with_the_accumulation_verdict(planted_run):
    report, _ = planted_run
    conclusion = report.data["conclusions"]["mlx:bf16"]
    assert report.data["replay"]["mlx:bf16"]["first_introduced"] is None
    first = report.data["first_divergence"]["mlx:bf16"]["stage"]
    assert first.startswith("vision.block.")  # narrowed into the block it first broke the contract in
    assert report.data["narrowing"]["mlx:bf16"]["steps"][0]["target"] == ".".join(first.split(".")[:3])
    assert conclusion["kind"] == "accumulation"
    assert conclusion["onset"] == "vision.patch_embed"  # bf16 rounding starts at the first operator
    assert conclusion["text"].startswith("no operator introduces the error; it accumulates from vision.patch_embed")
    assert conclusion["text"].endswith(f"it first breaks the contract at {first}")
    labels = report.data["replay"]["mlx:bf16"]["labels"]
    assert all(label["op_local_failures"] == 0 for label in labels)  # every op-local replay passes
    assert any(label["accumulated_failures"] > 0 for label in labels)  # while accumulated stages fail


def test_narrowed_stages_are_in_the_plan_and_only_in_their_pair(planted_run):
    report, _ = planted_run
    plan = [stage["id"] for stage in report.data["stage_plan"]]
    assert "vision.block.6.norm2" in plan and plan.index("vision.block.6.norm2") < plan.index("vision.block.6")
    rows = [row for row in report.rows if row.stage == "vision.block.6.norm2"]
    assert {row.pair for row in rows} == {"vision.block.6.norm2"}  # the other pairs did not capture block 6's
    assert not [row for row in report.rows if row.status == "missing"]


def test_rejudging_keeps_the_narrowed_stages_and_the_conclusions(planted_run, tmp_path):
    report, out = planted_run
    again = rejudge(out / "report.json", load_contract(None), tmp_path / "again.json")
    assert again.data["conclusions"] == report.data["conclusions"]
    assert again.data["lineage"] == report.data["lineage"]
    assert sorted((r.pair, r.stage) for r in again.rows) == sorted((r.pair, r.stage) for r in report.rows)
    loose = rejudge(out / "report.json", Contract.from_dict({"default": {"atol": 10.0, "rtol": 0.9}}), tmp_path / "x")
    assert loose.data["conclusions"]["mlx:bf16"]["kind"] == "agreement"


def test_the_lineage_follows_the_worst_row_through_raster_and_window_orders(planted_run):
    """The lineage reads one row per stage through each side's own order; restoring whole stages to raster order
    (an independent path) gives the same row errors."""
    from driftscope.taps.stages import orders_of

    report, _ = planted_run
    pair = "vision.block.6.norm2"
    lineage = report.data["lineage"][pair]
    first = report.data["first_divergence"][pair]
    assert lineage["stage"] == pair and lineage["coords"] == first["max_coords"]
    reference, candidate = report.pair_tapsets(pair)
    order = orders_of(report.plan)["window"]
    stages = {entry["stage"]: entry for entry in lineage["stages"]}
    assert list(stages)[0] == "vision.patch_embed" and list(stages)[-1] == pair
    for stage_id, entry in stages.items():
        unit = report.plan[stage_id].token_unit
        sides = []
        for tapset in (reference, candidate):
            array = np.asarray(tapset[stage_id], dtype=np.float64)
            if report.plan[stage_id].token_order == "window":
                array = order.to_raster(array, np.asarray(tapset["vision.window_index"]), unit)
            sides.append(array.reshape(array.shape[0], -1)[lineage["raster_row"]])
        assert entry["max_abs"] == pytest.approx(np.abs(sides[1] - sides[0]).max(), rel=1e-12, abs=1e-12), stage_id
    last = stages[pair]
    assert last["failures"] > 0 and last["max_excess"] == pytest.approx(first["excess"], rel=1e-9)
    assert all(entry["failures"] == 0 for stage_id, entry in stages.items() if stage_id != pair)


@pytest.mark.slow
def test_every_operator_kind_planted_is_named(tmp_path):
    report = run(MORE, tmp_path / "run")
    for stage in MORE:
        assert report.data["replay"][stage]["first_introduced"] == stage, report.data["conclusions"][stage]
        assert report.data["conclusions"][stage]["kind"] == "introduced"


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory, tiny_checkpoint, shapes_inputs):
    """Block-level captures of the oracle and of MLX f32 with a defect planted in block 3's up projection."""
    out = tmp_path_factory.mktemp("blocks")
    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection(blocks=True))
    oracle = get_runtime("transformers")(tiny_checkpoint)
    patch = parse_patch(planted("vision.block.3.mlp.up", "mlx")["patch"])
    candidate = get_runtime("mlx")(tiny_checkpoint, "f32", patch, {"label": "up"})
    return (
        plan,
        out,
        (oracle, oracle.capture(shapes_inputs, plan, out / "oracle")),
        (
            candidate,
            candidate.capture(shapes_inputs, plan, out / "up"),
        ),
    )


def test_without_narrowing_the_replay_names_only_the_block(block_runs, tiny_checkpoint, shapes_inputs, tmp_path):
    plan, _, (oracle, oracle_taps), (candidate, candidate_taps) = block_runs
    full = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config)
    common = (shapes_inputs, plan, full, Contract(), tmp_path, "up")
    coarse = judge_pair(Side(oracle, oracle_taps), Side(candidate, candidate_taps), *common, narrow=False)
    assert coarse.drill.first_introduced == "vision.block.3" and not coarse.narrowing["steps"]
    fine = judge_pair(Side(oracle, oracle_taps), Side(candidate, candidate_taps), *common, narrow=True)
    assert fine.drill.first_introduced == "vision.block.3.mlp.up"
    assert fine.conclusion["kind"] == "introduced"


@pytest.mark.parametrize("name,policy", [("mlx", "f32"), ("mlx", "f16"), ("transformers", "f32")])
def test_a_rerun_from_stored_inputs_reproduces_the_forward(
    captures, tiny_checkpoint, full_plan, tmp_path, name, policy
):
    """A block's substages re-run from the stored block input equal the ones its forward tapped (session captures of
    every stage), to round-off: the mid-tower re-run is the forward, not an approximation of it."""
    runtime = get_runtime(name)(tiny_checkpoint, policy)
    forward = captures[f"{name}:{policy}"]
    full = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config)
    stages = list(get_family(tiny_checkpoint.family).substages_of("vision.block.5", full))
    rerun = rerun_from_stored(runtime, forward, full, stages, tmp_path / "rerun")
    assert rerun.stage_ids() == stages
    floor = 1e-5 if policy == "f32" else 2e-3  # f16: an ulp here and there where the one-at-a-time order differs
    rows = [row for row in compare_tapsets(forward, rerun, Contract(), full) if row.stage in stages]
    assert [row.stage for row in rows] == stages
    for row in rows:
        assert row.status == "pass" and row.relative_rms < floor, (row.stage, row.relative_rms)


def test_a_targeted_forward_taps_only_the_asked_stages(block_runs, tiny_checkpoint, shapes_inputs, tmp_path):
    _, _, _, (candidate, candidate_taps) = block_runs
    full = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config)
    stages = ["vision.block.3.norm2", "vision.block.3.mlp.up"]
    forward = targeted_forward(candidate, shapes_inputs, full, stages, tmp_path / "forward")
    rerun = rerun_from_stored(
        candidate,
        candidate_taps,
        full,
        get_family(full.family).substages_of("vision.block.3", full),
        tmp_path / "rerun",
    )
    assert set(forward.stage_ids()) == set(stages)
    for stage in stages:
        np.testing.assert_allclose(np.asarray(forward[stage]), np.asarray(rerun[stage]), rtol=1e-5, atol=1e-5)
    assert FORWARD != RERUN


def test_a_candidate_read_from_a_file_cannot_be_narrowed_and_says_so(
    block_runs, tiny_checkpoint, shapes_inputs, tmp_path
):
    plan, _, (oracle, oracle_taps), (_, candidate_taps) = block_runs
    engine = get_runtime("tapfile")(tiny_checkpoint, "f32", options={"path": str(candidate_taps.tensor_path)})
    full = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config)
    result = judge_pair(
        Side(oracle, oracle_taps), Side(engine, candidate_taps), shapes_inputs, plan, full, Contract(), tmp_path, "file"
    )
    (step,) = result.narrowing["steps"]
    assert step["target"] == "vision.block.3" and "come from a file" in step["error"]
    assert result.narrowing["added"] == [] and result.drill is None
    assert result.conclusion["kind"] == "not replayed" and result.conclusion["first_divergence"] == "vision.block.3"


def test_narrowing_is_generic_over_families(tmp_path):
    """Qwen3-VL (no window order, DeepStack branches): a scaled block output found with block taps alone; narrowing
    captures that block's substages on both sides by re-running them from the stored block input, and they are clean
    (the defect is in the block's output, after its last substage), so the block itself is what introduces it."""
    from driftscope.families import get_family as family_of

    tiny = family_of("qwen3_vl").tiny
    patch = {"callable": "driftscope.hypotheses:scale_block_output", "kwargs": {"block": 1, "factor": 1.5}}
    data = {
        "name": "narrowing-qwen3",
        "checkpoint": str(tiny.ensure()),
        "images": [str(image) for image in tiny.images],
        "runtimes": ["transformers:f32", {"runtime": "mlx", "policy": "f32", "label": "scaled", "patch": patch}],
        "stages": {"blocks": True},
        "notebooks": [],
    }
    report = investigate(parse_parameters(data, "test"), tmp_path / "run")
    narrowing = report.data["narrowing"]["scaled"]
    (step,) = narrowing["steps"]
    assert step["target"] == "vision.block.1" and {step["reference"], step["candidate"]} == {RERUN}
    assert narrowing["added"] and all(stage.startswith("vision.block.1.") for stage in narrowing["added"])
    labels = {label["stage"]: label["label"] for label in report.data["replay"]["scaled"]["labels"]}
    assert all(labels[stage] == "clean" for stage in narrowing["added"])
    assert report.data["replay"]["scaled"]["first_introduced"] == "vision.block.1"
    assert report.data["conclusions"]["scaled"]["kind"] == "introduced"
    assert report.data["lineage"]["scaled"]["stages"][-1]["failures"] > 0
