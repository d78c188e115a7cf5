"""Every registered family with a quantization profile, on its tiny q4 fixture (``make_tiny_q4.py``: vision and text
in 4 bits): MLX's fused ``q4`` in float32 agrees with the oracle on the host-dequantized codes within 1e-4 at every
vision stage, the oracle's weights are ``mx.dequantize`` of MLX's layers bit for bit, and the linear controls find
the family's quantized linears behind its substages."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, get_family, stage_plan
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from driftscope.judge.compare import compare_stage
from driftscope.judge.contract import Tolerance
from driftscope.model.quant.affine import mlx_core
from driftscope.model.weightfile import TensorFiles
from driftscope.taps.stages import StageSelection

QUANTIZED = [name for name in FAMILIES.names() if get_family(name).quantization is not None]


def test_a_family_without_a_profile_refuses_quantized_policies_by_name():
    """Qwen2.5-VL and Qwen3-VL have profiles; a family without one (today Molmo2) says so and what to do."""
    from driftscope.errors import RuntimeUnavailableError

    assert {"qwen2_5_vl", "qwen3_vl"} <= set(QUANTIZED)
    for name in sorted(set(FAMILIES.names()) - set(QUANTIZED)):
        with pytest.raises(RuntimeUnavailableError, match=f"model family '{name}' has no quantization profile"):
            get_family(name).quant_profile()


@pytest.fixture(scope="module", params=QUANTIZED)
def family_q4(request, tmp_path_factory):
    from make_tiny_q4 import ensure_q4

    family = get_family(request.param)
    checkpoint = open_checkpoint(ensure_q4(family))
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection(blocks=True, substages=(0,)))
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    out = tmp_path_factory.mktemp(f"q4-{family.name}")
    oracle = get_runtime("transformers")(checkpoint, "q4-dequant")
    fused = get_runtime("mlx")(checkpoint, "q4")
    taps = {
        "oracle": oracle.capture(inputs, plan, out / "oracle"),
        "fused": fused.capture(inputs, plan, out / "fused"),
    }
    return family, checkpoint, plan, oracle, fused, taps


def test_fused_q4_in_float32_agrees_with_the_dequantized_oracle(family_q4):
    family, _, _, _, _, taps = family_q4
    stages = [s for s in taps["oracle"].stage_ids() if s.startswith("vision.") and s in taps["fused"]]
    assert len(stages) > 10 and "vision.block.0.attn.v" in stages
    rows = [compare_stage(s, taps["oracle"], taps["fused"], Tolerance(1e-4, 0.0), i) for i, s in enumerate(stages)]
    assert all(row.status == "pass" for row in rows), (family.name, max(rows, key=lambda row: row.max_abs))


def test_the_oracle_runs_mx_dequantize_of_every_quantized_layer(family_q4):
    family, checkpoint, _, oracle, fused, _ = family_q4
    mx = mlx_core()
    names = family.quant_profile().mlx_names
    dense = TensorFiles(oracle.checkpoint.path)
    layers = [(path, m) for path, m in fused.model.named_modules() if "scales" in m]
    assert len(layers) == sum(oracle.quantized.report["quantized"].values()) > 10
    for path, layer in layers:
        expected = np.array(mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits))
        assert np.array_equal(dense.read(names.to_checkpoint(path + ".weight")), expected), path


def test_linear_controls_cover_the_familys_linears(family_q4):
    family, _, plan, _, fused, taps = family_q4
    controls = fused.same_input_controls(taps["oracle"], plan)
    modules = {row["module"] for row in controls["rows"]}
    assert any(module.endswith(".attn.qkv") for module in modules) and len(modules) >= 4, (family.name, modules)
    assert all(row["label"] == "none" for row in controls["rows"]), controls["rows"]  # float32: round-off only


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["jax", "iree"])
def test_the_compiled_path_runs_the_same_dequantized_weights(family_q4, runtime, tmp_path):
    """``jax:q4-dequant`` and ``iree:q4-dequant`` (the family's emitter on the dense dequantized checkpoint) agree
    with the oracle within 1e-4 on every vision stage."""
    family, checkpoint, plan, _, _, taps = family_q4
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    compiled = get_runtime(runtime)(checkpoint, "q4-dequant").capture(inputs, plan, tmp_path / runtime)
    stages = [s for s in taps["oracle"].stage_ids() if s.startswith("vision.") and s in compiled]
    assert len(stages) > 10
    rows = [compare_stage(s, taps["oracle"], compiled, Tolerance(1e-4, 0.0), i) for i, s in enumerate(stages)]
    assert all(row.status == "pass" for row in rows), (family.name, max(rows, key=lambda row: row.max_abs))
