"""The tiny q4 checkpoint through today's runtimes: the dequantized oracle agrees with MLX's fused q4 in float32,
and in float16 the oracle is closer to MLX's dequantized path than to its fused one (the half-accumulating kernel).

The dense checkpoints are what :mod:`driftscope.quant.dense_checkpoint` writes from the MLX-community directory;
``MLXCommunityRuntime`` is the MLX runtime with mlx-vlm's own loader for quantized directories (the load the
runtime wiring of issue 18 adds). Everything else is the runtimes' unchanged capture code.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from driftscope.checkpoint import open_checkpoint
from driftscope.compare import compare_stage
from driftscope.contract import Tolerance
from driftscope.families import stage_plan
from driftscope.inputs import prepare_inputs
from driftscope.quant.affine import mlx_core
from driftscope.quant.attribution import attribute, closer_to_tapsets
from driftscope.quant.dense_checkpoint import write_dense_checkpoint
from driftscope.quant.linear_replay import layer_of, replay_linear
from driftscope.quant.mlx_checkpoint import MLXQuantizedCheckpoint
from driftscope.quant.profiles import get_profile
from driftscope.runtimes.mlx_runtime import DTYPES, MLXRuntime
from driftscope.runtimes.transformers_runtime import TransformersRuntime
from driftscope.stages import StageSelection

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "fixtures" / "images" / "checkerboard_140.png"  # 100 patches: cheap
PROFILE = get_profile("qwen2_5_vl")


class MLXCommunityRuntime(MLXRuntime):
    """MLX on a quantized directory, loaded by mlx-vlm's own ``load_model`` (fused quantized layers)."""

    def _load(self):
        mx = mlx_core()  # OpenBLAS before mlx.core, as MLXRuntime._load does
        from mlx_vlm.utils import load_model

        model = load_model(self.checkpoint.path)
        if self.policy.name != "f32":
            model.set_dtype(getattr(mx, DTYPES[self.policy.name]))  # casts the scales and biases too
            mx.eval(model.parameters())
        return model


@pytest.fixture(scope="module")
def q4_taps(tiny_checkpoint_dir, tmp_path_factory):
    from make_tiny_q4 import DEFAULT_OUT, main

    main([str(DEFAULT_OUT), "--source", str(tiny_checkpoint_dir)])
    out = tmp_path_factory.mktemp("q4")
    source = MLXQuantizedCheckpoint(DEFAULT_OUT)
    dense = {
        activations: write_dense_checkpoint(
            out / f"dense-{activations}",
            PROFILE.mlx_names.weights_to_checkpoint(source.dense_weights(activations)),
            source.config,
            copy_from=DEFAULT_OUT,
            provenance={"source": DEFAULT_OUT.name, "activations": activations},
        )
        for activations in ("float32", "float16")
    }
    quantized = open_checkpoint(DEFAULT_OUT)
    inputs = prepare_inputs(quantized, [IMAGE])
    plan = stage_plan(quantized.family, quantized.config).select(StageSelection(blocks=True, substages=(0,)))
    runs = {
        "transformers:q4-dequant": TransformersRuntime(open_checkpoint(dense["float32"]), "f32"),
        "mlx:q4": MLXCommunityRuntime(quantized, "f32"),
        "mlx:q4-f16": MLXCommunityRuntime(quantized, "f16"),
        "mlx:q4-dequant-f16": MLXRuntime(open_checkpoint(dense["float16"]), "f16"),
    }
    taps = {}
    for label, runtime in runs.items():
        runtime.options["label"] = label
        taps[label] = runtime.capture(inputs, plan, out / label.replace(":", "_"))
    return SimpleNamespace(taps=taps, runs=runs, dense=dense, inputs=inputs, plan=plan)


def test_fused_q4_in_float32_agrees_with_the_dequantized_oracle(q4_taps):
    taps = q4_taps.taps
    oracle, fused = taps["transformers:q4-dequant"], taps["mlx:q4"]
    stages = [s for s in oracle.stage_ids() if s.startswith("vision.") and s in fused]
    assert "vision.block.7" in stages and "vision.merger" in stages and "vision.block.0.mlp.down" in stages
    rows = [compare_stage(s, oracle, fused, Tolerance(atol=1e-4, rtol=0.0), i) for i, s in enumerate(stages)]
    worst = max(rows, key=lambda row: row.max_abs)
    assert all(row.status == "pass" for row in rows), worst
    assert worst.max_abs < 1e-4


def test_oracle_is_closer_to_the_dequantized_half_path_than_to_the_fused_one(q4_taps):
    taps = q4_taps.taps
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


def test_first_quantized_linears_replayed_on_the_oracles_inputs(q4_taps):
    """Block 0's MLP projections, fused and dequantized on the oracle's own inputs: round-off apart in float32,
    apart in float16. At these widths (64 and 128 inputs) the fused kernel's half accumulation adds about as much error
    as the float16 activations themselves (1.5-2x), so the replay names both; at 1152+ it dominates
    (test_quant_fused)."""
    taps, runs = q4_taps.taps, q4_taps.runs
    oracle = taps["transformers:q4-dequant"]
    mlp = runs["mlx:q4"].model.vision_tower.blocks[0].mlp
    for module, inputs, output in ((mlp.gate_proj, "norm2", "mlp.gate"), (mlp.down_proj, "mlp.product", "mlp.down")):
        tensor, bias = layer_of(module)
        x, expected = oracle[f"vision.block.0.{inputs}"], oracle[f"vision.block.0.{output}"]
        exact = replay_linear(x, tensor, bias, "float32", reference=expected, name=output)
        assert exact.fused_vs_dequantized < 1e-6 and exact.label == "none"  # float32 round-off
        assert exact.to_dict()["dequantized_vs_reference"] < 1e-6  # the oracle ran the same dequantized weights
        half = replay_linear(x, tensor, bias, "float16", reference=expected, name=output).to_dict()
        assert half["fused_vs_reference"] > half["dequantized_vs_reference"] > 1e-4
        assert 1.0 < half["fused_vs_dequantized"] / half["dequantized_vs_reference"] < 4.0
        assert half["label"] == "fused kernel + activation dtype"
        assert np.isfinite(half["max_abs_fused_vs_dequantized"]) and half["max_abs_fused_vs_dequantized"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["jax", "iree"])
def test_compiled_path_runs_the_same_dequantized_weights(q4_taps, runtime, tmp_path):
    """jax:q4-dequant and iree:q4-dequant (the dense checkpoint, unchanged runtimes) agree with the oracle."""
    from driftscope.runtimes import get_runtime

    oracle = q4_taps.taps["transformers:q4-dequant"]
    compiled = get_runtime(runtime)(open_checkpoint(q4_taps.dense["float32"]), "f32", options={"label": runtime})
    taps = compiled.capture(q4_taps.inputs, q4_taps.plan, tmp_path / runtime)
    stages = [s for s in oracle.stage_ids() if s.startswith("vision.") and s in taps]
    assert "vision.block.7" in stages and "vision.merger" in stages
    rows = [compare_stage(s, oracle, taps, Tolerance(atol=1e-4, rtol=0.0), i) for i, s in enumerate(stages)]
    assert all(row.status == "pass" for row in rows), max(rows, key=lambda row: row.max_abs)
