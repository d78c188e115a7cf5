"""Quantized policies through the runtimes on the tiny q4 fixture (an MLX-community directory, vision and text in
4 bits): ``transformers:q4-dequant`` (the oracle on the host-dequantized weights) agrees with MLX's fused ``q4`` in
float32; in float16 the oracle is closer to ``mlx:q4-dequant-f16`` than to ``mlx:q4-f16``; the linear controls run
each quantized linear fused and dequantized on the oracle's inputs; a dense checkpoint quantized on load (MLX) and on
the host (the oracle) gives the same weights; ``jax``/``iree`` run the oracle's dense weights (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import CheckpointError, ParameterError
from driftscope.families import get_family, stage_plan
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from driftscope.judge.attribution import attribute, closer_to_tapsets
from driftscope.judge.compare import compare_stage
from driftscope.judge.contract import Tolerance
from driftscope.model.quant.affine import mlx_core
from driftscope.model.weightfile import TensorFiles
from driftscope.taps.stages import StageSelection

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "fixtures" / "images" / "checkerboard_140.png"  # 100 patches: cheap
FAMILY = "qwen2_5_vl"


def exact_rows(reference, candidate, atol=1e-4):
    stages = [s for s in reference.stage_ids() if s.startswith("vision.") and s in candidate]
    assert "vision.block.7" in stages and "vision.merger" in stages and "vision.block.0.mlp.down" in stages
    return [compare_stage(s, reference, candidate, Tolerance(atol=atol, rtol=0.0), i) for i, s in enumerate(stages)]


@pytest.fixture(scope="module")
def q4(tiny_checkpoint_dir, tmp_path_factory):
    from make_tiny_q4 import ensure_q4

    quantized = open_checkpoint(ensure_q4(get_family(FAMILY)))
    out = tmp_path_factory.mktemp("q4")
    inputs = prepare_inputs(quantized, [IMAGE])
    plan = stage_plan(quantized.family, quantized.config).select(StageSelection(blocks=True, substages=(0,)))
    runs = {
        label: get_runtime(label.split(":")[0])(quantized, label.split(":")[1])
        for label in ("transformers:q4-dequant", "mlx:q4", "mlx:q4-f16", "mlx:q4-dequant-f16")
    }
    taps = {label: runtime.capture(inputs, plan, out / label.replace(":", "_")) for label, runtime in runs.items()}
    return SimpleNamespace(checkpoint=quantized, taps=taps, runs=runs, inputs=inputs, plan=plan)


def test_fused_q4_in_float32_agrees_with_the_dequantized_oracle(q4):
    rows = exact_rows(q4.taps["transformers:q4-dequant"], q4.taps["mlx:q4"])
    worst = max(rows, key=lambda row: row.max_abs)
    assert all(row.status == "pass" for row in rows), worst
    assert 0 < worst.max_abs < 1e-4  # not the same code path: float32 round-off, not zero


def test_the_oracle_runs_exactly_mx_dequantize_of_the_checkpoints_codes(q4):
    """The dense checkpoint transformers loaded holds, bit for bit, ``mx.dequantize`` of MLX's loaded layers."""
    mx = mlx_core()
    oracle, fused = q4.runs["transformers:q4-dequant"], q4.runs["mlx:q4"]
    assert oracle.checkpoint.path != q4.checkpoint.path  # the dense dequantized copy, not the source
    dense = TensorFiles(oracle.checkpoint.path)
    names = get_family(FAMILY).quant_profile().mlx_names
    modules = dict(fused.model.named_modules())
    checked = 0
    for path in ("vision_tower.blocks.0.attn.qkv", "vision_tower.blocks.7.mlp.down_proj", "language_model.lm_head"):
        layer = modules[path]
        expected = mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits)
        stored = dense.read(names.to_checkpoint(path + ".weight"))
        assert stored.dtype == np.float32 and np.array_equal(stored, np.array(expected)), path
        checked += 1
    assert checked == 3


def test_the_report_records_what_each_runtime_quantized(q4):
    meta = q4.taps["transformers:q4-dequant"].meta["quantization"]
    assert (meta["bits"], meta["group_size"], meta["execution"], meta["activations"]) == (4, 64, "dequant", "float32")
    assert meta["quantized"]["vision"] > 0 and meta["quantized"]["text"] > 0
    assert meta["left_dense"] == [] and meta["naming"] == "mlx"
    fused = q4.taps["mlx:q4-f16"].meta["quantization"]
    assert (fused["execution"], fused["activations"]) == ("fused", "float16") and "dense_checkpoint" not in fused
    assert q4.taps["mlx:q4"].meta["checkpoint"] == str(q4.checkpoint.path)


def test_oracle_is_closer_to_the_dequantized_half_path_than_to_the_fused_one(q4):
    taps = q4.taps
    rows = closer_to_tapsets(taps["transformers:q4-dequant"], [taps["mlx:q4-f16"], taps["mlx:q4-dequant-f16"]])
    result = attribute("transformers:q4-dequant", rows)
    assert (result.winner, result.wins, len(result.counted)) == ("mlx:q4-dequant-f16", 8, 8), result.verdict
    assert result.verdict.startswith(
        "transformers:q4-dequant is closer to mlx:q4-dequant-f16 than to mlx:q4-f16 at 8/8 blocks (median ratio "
    )
    assert result.verdict.endswith(
        "the remaining drift is the fused kernel's accumulation, not transformers' own arithmetic"
    )
    assert all(row.ratio > 1.2 for row in result.counted)


def test_linear_controls_run_each_quantized_linear_fused_and_dequantized_on_the_oracles_input(q4):
    """Block 0's linears on the oracle's own inputs: float32 round-off apart in f32; in f16 the fused path is
    further from the oracle than the dequantized one (at 64/128 inputs both error sources are named)."""
    oracle = q4.taps["transformers:q4-dequant"]
    exact = q4.runs["mlx:q4"].same_input_controls(oracle, q4.plan)
    stages = [row["stage"] for row in exact["rows"]]
    assert {f"vision.block.0.{s}" for s in ("attn.v", "attn.out", "mlp.gate", "mlp.up", "mlp.down")} <= set(stages)
    assert all(row["label"] == "none" and row["fused_vs_dequantized"] < 1e-5 for row in exact["rows"]), exact
    assert all(row["dequantized_vs_reference"] < 1e-5 for row in exact["rows"])  # the oracle ran these weights
    half = q4.runs["mlx:q4-f16"].same_input_controls(oracle, q4.plan)
    assert half["activations"] == "float16" and len(half["rows"]) == len(exact["rows"])
    for row in half["rows"]:
        assert row["fused_vs_reference"] > row["dequantized_vs_reference"] > 1e-4, row
        assert row["label"].startswith("fused kernel") or row["label"] == "activation dtype", row
    assert q4.runs["mlx:q4-dequant-f16"].same_input_controls(oracle, q4.plan) is None  # no fused layer to replay


def test_a_dense_checkpoint_quantized_on_load_and_on_the_host_runs_the_same_weights(tiny_checkpoint, tmp_path):
    """``mlx:q4`` quantizes the dense fixture with ``nn.quantize``; ``transformers:q4-dequant`` with ``mx.quantize``
    on the host by tensor name: in float32 they agree like on the MLX-community directory."""
    inputs = prepare_inputs(tiny_checkpoint, [IMAGE])
    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(
        StageSelection(blocks=True, substages=(0,))
    )
    oracle = get_runtime("transformers")(tiny_checkpoint, "q4-dequant").capture(inputs, plan, tmp_path / "t")
    fused = get_runtime("mlx")(tiny_checkpoint, "q4").capture(inputs, plan, tmp_path / "m")
    dense = get_runtime("transformers")(tiny_checkpoint, "f32").capture(inputs, plan, tmp_path / "f")
    rows = exact_rows(oracle, fused)
    assert all(row.status == "pass" for row in rows), max(rows, key=lambda row: row.max_abs)
    assert oracle.meta["quantization"]["naming"] == "checkpoint"
    quantization_error = max(row.max_abs for row in exact_rows(dense, oracle, atol=1.0))
    assert quantization_error > 1e-3  # the oracle really ran 4-bit weights


def test_a_layer_the_group_size_does_not_divide_stays_dense_and_is_reported(tiny_checkpoint):
    runtime = get_runtime("transformers")(tiny_checkpoint, "q8-dequant", options={"group_size": 128})
    runtime.load()
    report = runtime.quantized.report
    left = {row["name"]: row["reason"] for row in report["left_dense"]}
    assert left, report
    assert all(reason.startswith("input width 64 is not a multiple of the group size 128") for reason in left.values())
    assert (report["bits"], report["group_size"]) == (8, 128) and report["quantized"]["vision"] > 0
    mlx = get_runtime("mlx")(tiny_checkpoint, "q8", options={"group_size": 128})
    mlx.load()  # the same layers stay dense in MLX (nn.quantize would refuse them)
    qkv = mlx.model.vision_tower.blocks[0].attn.qkv
    assert not hasattr(qkv, "scales") and hasattr(mlx.model.vision_tower.blocks[0].mlp.down_proj, "scales")


def test_an_mlx_community_checkpoint_with_a_layer_left_dense_loads_and_reports_it(tiny_checkpoint_dir, tmp_path):
    """8 bits at group size 128: the 64-wide layers stay dense in the directory; MLX loads it as is, the oracle's
    dense checkpoint keeps those layers' float weights, and both reports list them with the reason."""
    from make_tiny_q4 import main

    main([str(tmp_path / "q8"), "--source", str(tiny_checkpoint_dir), "--bits", "8", "--group-size", "128"])
    quantized = open_checkpoint(tmp_path / "q8")
    oracle = get_runtime("transformers")(quantized, "q8-dequant")
    fused = get_runtime("mlx")(quantized, "q8")
    oracle.load()
    fused.load()
    for runtime in (oracle, fused):
        left = {row["name"]: row["reason"] for row in runtime.quantized.report["left_dense"]}
        assert left["vision_tower.blocks.0.attn.qkv.weight"] == "input width 64 is not a multiple of the group size 128"
    assert not hasattr(fused.model.vision_tower.blocks[0].attn.qkv, "scales")
    assert fused.model.vision_tower.blocks[0].mlp.down_proj.bits == 8
    dense = TensorFiles(oracle.checkpoint.path).read("visual.blocks.0.attn.qkv.weight")
    original = TensorFiles(tiny_checkpoint_dir).read("visual.blocks.0.attn.qkv.weight")
    assert np.array_equal(dense, original.astype(np.float32))  # left dense: the checkpoint's own weights


def test_policies_that_do_not_fit_the_checkpoint_are_named(q4, tiny_checkpoint):
    with pytest.raises(CheckpointError, match="(?s)is MLX-quantized .*fix: use q4 "):
        get_runtime("transformers")(q4.checkpoint, "f32")
    with pytest.raises(CheckpointError, match="(?s)holds 4-bit codes.*use policy 'q4'"):
        get_runtime("mlx")(q4.checkpoint, "q8")
    with pytest.raises(ParameterError, match="contradicts the checkpoint's quantization"):
        get_runtime("mlx")(q4.checkpoint, "q4", options={"group_size": 32})
    with pytest.raises(ParameterError, match="not quantized"):
        get_runtime("mlx")(tiny_checkpoint, "f16", options={"group_size": 64})


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["jax", "iree"])
def test_compiled_path_runs_the_same_dequantized_weights(q4, runtime, tmp_path):
    """jax:q4-dequant and iree:q4-dequant agree with the oracle within 1e-4 on every stage."""
    taps = get_runtime(runtime)(q4.checkpoint, "q4-dequant").capture(q4.inputs, q4.plan, tmp_path / runtime)
    assert taps.meta["quantization"]["execution"] == "dequant"
    rows = exact_rows(q4.taps["transformers:q4-dequant"], taps)
    assert all(row.status == "pass" for row in rows), max(rows, key=lambda row: row.max_abs)


def test_an_investigation_reports_the_attribution_and_the_linear_controls(tiny_checkpoint_dir, tmp_path):
    """The parameters' ``attribution`` section and the replay of a fused half policy, through ``driftscope run``:
    the report holds the closer-to verdict over the blocks, the linear controls with each stage's replay label,
    and what each runtime quantized; notebook 02 shows them; ``rejudge`` keeps the controls and relabels them."""
    from driftscope.cli import main
    from driftscope.judge.contract import load_contract
    from driftscope.run.rejudge import rejudge
    from make_tiny_q4 import ensure_q4

    data = {
        "name": "q4-attribution",
        "checkpoint": str(ensure_q4(get_family(FAMILY))),
        "images": [str(IMAGE)],
        "runtimes": ["transformers:q4-dequant", "mlx:q4", "mlx:q4-f16", "mlx:q4-dequant-f16"],
        "replay": ["mlx:q4-f16"],
        "attribution": {"candidate": "mlx:q4", "references": ["mlx:q4-f16", "mlx:q4-dequant-f16"]},
        "stages": {"blocks": True, "substages": [0]},
        "notebooks": ["02_layer_drilldown"],
    }
    (tmp_path / "q4.yaml").write_text(yaml.safe_dump(data))
    assert main(["run", str(tmp_path / "q4.yaml"), "--out", str(tmp_path / "run"), "--no-gate"]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    attribution = report["attribution"]
    assert (attribution["winner"], attribution["candidate"]) == ("mlx:q4-dequant-f16", "mlx:q4"), attribution
    assert attribution["verdict"].startswith("mlx:q4 is closer to mlx:q4-dequant-f16 than to mlx:q4-f16 at 8/8 blocks")
    controls = report["linear_replay"]["mlx:q4-f16"]
    labels = {row["stage"]: row["label"] for row in report["replay"]["mlx:q4-f16"]["labels"]}
    assert controls["rows"] and all(row["stage_label"] == labels[row["stage"]] for row in controls["rows"])
    assert controls["verdict"].startswith("mlx:q4-f16: ")
    assert {r["label"]: r["quantization"]["execution"] for r in report["runtimes"]} == {
        "transformers:q4-dequant": "dequant",
        "mlx:q4": "fused",
        "mlx:q4-f16": "fused",
        "mlx:q4-dequant-f16": "dequant",
    }
    notebook = json.loads((tmp_path / "run" / "02_layer_drilldown.ipynb").read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    section = [cell for cell in notebook["cells"] if "quantized_items" in "".join(cell["source"])]
    shown = json.dumps(section[0]["outputs"])
    assert "Closer-to attribution" in shown and "Same-input linear replay" in shown and "image/png" in shown
    loose = rejudge(tmp_path / "run" / "report.json", load_contract(ROOT / "parameters" / "contracts" / "default.yaml"))
    relabelled = loose.data["linear_replay"]["mlx:q4-f16"]
    assert [row["fused_vs_dequantized"] for row in relabelled["rows"]] == [
        row["fused_vs_dequantized"] for row in controls["rows"]
    ]
    assert {row["stage_label"] for row in relabelled["rows"]} <= {"clean", "inherited", None}  # atol 0.08: no failure


def test_49_5_a_cached_dense_checkpoint_changed_since_it_was_written_is_written_again(q4):
    """The dense dequantized checkpoint is a cache entry: its weights rewritten in place are refused by its sealed
    manifest, and the dequantized weights written again (bit for bit what they were)."""

    def dense_path():
        runtime = get_runtime("transformers")(q4.checkpoint, "q4-dequant")
        runtime.load()  # the dense checkpoint is what loads: a cache entry, never the source's folder
        path = runtime.checkpoint.path
        runtime.release()
        return path

    first = dense_path()
    assert first != q4.checkpoint.path and q4.checkpoint.path not in first.parents
    weights = first / "model.safetensors"
    honest = weights.read_bytes()
    data = bytearray(honest)
    data[-4:] = np.float32(7.0).tobytes()
    weights.write_bytes(bytes(data))
    again = dense_path()
    assert again == first and (again / "model.safetensors").read_bytes() == honest
