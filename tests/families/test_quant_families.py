"""Every registered family with a quantization profile (all three), on its tiny q4 fixture (``make_tiny_q4.py``:
vision and text in 4 bits, at the family's fixture group size): MLX's fused ``q4`` and the host-dequantized codes
agree within 1e-4 in float32 at every vision stage, whichever runtime runs the dense codes (transformers, MLX,
jax, iree); the oracle's weights are ``mx.dequantize`` of MLX's layers bit for bit; layers the group size does not
divide stay dense and are reported; the linear controls find the family's quantized linears behind its substages;
with float16 activations the closer-to attribution names the fused kernel.

MLX runs with the family's known-defect patch (``Family.known_defects``: a port's own defects are not
quantization error)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, get_family, stage_plan
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from driftscope.judge.compare import compare_stage
from driftscope.judge.contract import Tolerance
from driftscope.model.quant.affine import mlx_core
from driftscope.model.weightfile import TensorFiles
from driftscope.taps.stages import StageSelection

QUANTIZED = [name for name in FAMILIES.names() if get_family(name).quantization is not None]
#: Qwen3-VL-MoE shares Qwen3-VL's tower (run here by default); its own experts' q4 is in
#: test_qwen3_vl_moe_quant.py, and its runs here (~60 s) are slow
SLOW = {"qwen3_vl_moe"}
FAMILY_PARAMS = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in QUANTIZED]
HEAD = ("vision.", "pool.", "projector.")  # the image side: Molmo2's pooler and projector follow its ViT


def _runtime(family, runtime: str, checkpoint, policy: str, **kwargs):
    return get_runtime(runtime)(checkpoint, policy, parse_patch(family.known_defects.get(runtime)), **kwargs)


def _rows(reference, candidate, atol: float = 1e-4):
    stages = [s for s in reference.stage_ids() if s.startswith(HEAD) and s in candidate]
    assert len(stages) > 10 and "vision.block.0.attn.v" in stages
    return [compare_stage(s, reference, candidate, Tolerance(atol, 0.0), i) for i, s in enumerate(stages)]


def _worst(rows):
    return max(rows, key=lambda row: row.max_abs)


def test_every_family_has_a_profile_and_one_without_refuses_quantized_policies_by_name():
    from driftscope.errors import RuntimeUnavailableError

    assert {"qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "molmo2"} <= set(QUANTIZED)
    bare = dataclasses.replace(get_family(QUANTIZED[0]), quantization=None)
    with pytest.raises(RuntimeUnavailableError, match=f"model family '{bare.name}' has no quantization profile"):
        bare.quant_profile()


@pytest.fixture(scope="module", params=FAMILY_PARAMS)
def family_q4(request, tmp_path_factory):
    from make_tiny_q4 import ensure_q4

    family = get_family(request.param)
    checkpoint = open_checkpoint(ensure_q4(family))
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection(blocks=True, substages=(0,)))
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    out = tmp_path_factory.mktemp(f"q4-{family.name}")
    oracle = _runtime(family, "transformers", checkpoint, "q4-dequant")
    fused = _runtime(family, "mlx", checkpoint, "q4")
    dequantized = _runtime(family, "mlx", checkpoint, "q4-dequant")
    taps = {
        "oracle": oracle.capture(inputs, plan, out / "oracle"),
        "fused": fused.capture(inputs, plan, out / "fused"),
        "mlx:q4-dequant": dequantized.capture(inputs, plan, out / "mlx-dequant"),
    }
    dequantized.release()
    return family, checkpoint, plan, oracle, fused, taps


def test_fused_q4_in_float32_agrees_with_the_dequantized_oracle(family_q4):
    family, _, _, _, _, taps = family_q4
    rows = _rows(taps["oracle"], taps["fused"])
    assert all(row.status == "pass" for row in rows), (family.name, _worst(rows))


def test_the_dequantized_oracle_agrees_with_mlx_on_the_same_dequantized_codes(family_q4):
    """``transformers:q4-dequant`` vs ``mlx:q4-dequant`` (float32): two engines on one dense checkpoint."""
    family, _, _, oracle, _, taps = family_q4
    assert taps["mlx:q4-dequant"].meta["quantization"]["dense_checkpoint"] == str(oracle.checkpoint.path)
    rows = _rows(taps["mlx:q4-dequant"], taps["oracle"])
    assert all(row.status == "pass" for row in rows), (family.name, _worst(rows))
    assert any(row.max_abs > 0 for row in rows)  # two engines, not one tap set twice


def test_the_oracle_runs_mx_dequantize_of_every_quantized_layer(family_q4):
    family, checkpoint, _, oracle, fused, _ = family_q4
    mx = mlx_core()
    names = family.quant_profile().mlx_names
    dense = TensorFiles(oracle.checkpoint.path)
    layers = [(path, m) for path, m in fused.model.named_modules() if "scales" in m]
    assert len(layers) == sum(oracle.quantized.report["quantized"].values()) > 10
    for path, layer in layers:
        expected = np.array(mx.dequantize(layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits))
        # a part of a joined tensor (stacked experts' gate and up projections) is split out of it
        assert np.array_equal(names.part_from_checkpoint(path + ".weight", dense.read), expected), path


def test_layers_the_group_size_does_not_divide_stay_dense_and_are_reported(family_q4):
    """Exactly the in-scope matrices whose input width the group size does not divide are dense in MLX, listed
    with the reason, and hold the source checkpoint's own weights in the oracle's dense checkpoint."""
    family, checkpoint, _, oracle, fused, _ = family_q4
    profile = family.quant_profile()
    size = oracle.quantized.report["group_size"]
    assert size == family.tiny.q4_group_size
    dense_in_mlx = {
        f"{path}.weight"
        for path, m in fused.model.named_modules()
        if profile.mlx.group(path + ".weight") and "weight" in m and m["weight"].ndim == 2 and "scales" not in m
    }
    reported = {row["name"]: row for row in oracle.quantized.report["left_dense"]}
    assert set(reported) == dense_in_mlx
    from make_tiny_q4 import q4_source

    source = TensorFiles(q4_source(family))
    for name, row in reported.items():
        assert row["input_width"] % size and row["reason"].startswith(f"input width {row['input_width']} is not")
        stored = TensorFiles(oracle.checkpoint.path).read(profile.mlx_names.to_checkpoint(name))
        assert np.array_equal(stored, source.read(profile.mlx_names.to_checkpoint(name)).astype(np.float32)), name


def test_linear_controls_cover_the_familys_linears(family_q4):
    family, _, plan, _, fused, taps = family_q4
    controls = fused.same_input_controls(taps["oracle"], plan)
    modules = {row["module"] for row in controls["rows"]}
    assert family.quant_profile().linears("vision.block.0.attn.v").module in modules, (family.name, modules)
    assert len(modules) >= 4, (family.name, modules)
    assert all(row["label"] == "none" for row in controls["rows"]), controls["rows"]  # float32: round-off only


#: the half-activation captures on MLX's CPU (half matmuls are slow there: ~25 s a family) run by default for
#: Qwen3-VL alone; Qwen2.5-VL's same attribution runs by default through ``driftscope run`` in
#: tests/capture/test_quant_runtimes.py (8/8 blocks), Molmo2's under ``-m slow``
HALF_DEFAULT = {"qwen3_vl"}


@pytest.mark.parametrize(
    "family_q4",
    [name if name in HALF_DEFAULT else pytest.param(name, marks=pytest.mark.slow) for name in QUANTIZED],
    indirect=True,
)
def test_with_half_activations_the_oracle_is_closer_to_the_dequantized_path(family_q4, tmp_path):
    """The closer-to attribution on real runs: against ``mlx:q4-f16`` (fused, half accumulation) and
    ``mlx:q4-dequant-f16`` (the same codes dequantized, half activations), the float32 oracle is nearer the
    dequantized path at every block: what is left is the fused kernel's accumulation."""
    from driftscope.judge.attribution import attribute, closer_to_tapsets

    family, checkpoint, plan, _, _, taps = family_q4
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    half = {}
    for policy in ("q4-f16", "q4-dequant-f16"):
        runtime = _runtime(family, "mlx", checkpoint, policy)
        half[policy] = runtime.capture(inputs, plan, tmp_path / policy)
        runtime.release()
    rows = closer_to_tapsets(taps["oracle"], [half["q4-f16"], half["q4-dequant-f16"]])
    attribution = attribute(taps["oracle"].label, rows)
    assert attribution.winner == "mlx:q4-dequant-f16", (family.name, attribution.verdict)
    assert attribution.wins == len(attribution.counted) == plan.depth, (family.name, attribution.verdict)
    assert "fused kernel's accumulation" in attribution.verdict


@pytest.mark.parametrize("name", FAMILY_PARAMS)
@pytest.mark.parametrize("bits", [4, 8])
def test_a_dense_checkpoint_quantized_on_load_runs_the_hosts_codes(bits, name, tmp_path):
    """``mlx:qN`` quantizes the dense tiny fixture after loading (``nn.quantize``), ``transformers:qN-dequant``
    quantizes its tensors on the host: the same codes, so float32 fused and dequantized agree within 1e-4."""
    family = get_family(name)
    checkpoint = open_checkpoint(family.tiny.ensure())
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection(blocks=True, substages=(0,)))
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    options = {"group_size": family.tiny.q4_group_size}
    oracle = _runtime(family, "transformers", checkpoint, f"q{bits}-dequant", options=options)
    fused = _runtime(family, "mlx", checkpoint, f"q{bits}", options=options)
    reference = oracle.capture(inputs, plan, tmp_path / name / "oracle")
    candidate = fused.capture(inputs, plan, tmp_path / name / "fused")
    assert fused.quantized.quantize_on_load and candidate.meta["quantization"]["bits"] == bits
    rows = _rows(reference, candidate)
    assert all(row.status == "pass" for row in rows), (name, bits, _worst(rows))
    oracle.release()
    fused.release()


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["jax", "iree"])
def test_the_compiled_path_runs_the_same_dequantized_weights(family_q4, runtime, tmp_path):
    """``jax:q4-dequant`` and ``iree:q4-dequant`` (the family's emitter on the dense dequantized checkpoint) agree
    with the oracle and with ``mlx:q4-dequant`` within 1e-4 on every image-side stage."""
    family, checkpoint, plan, _, _, taps = family_q4
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    compiled = get_runtime(runtime)(checkpoint, "q4-dequant").capture(inputs, plan, tmp_path / runtime)
    for reference in ("oracle", "mlx:q4-dequant"):
        rows = _rows(taps[reference], compiled)
        assert all(row.status == "pass" for row in rows), (family.name, reference, _worst(rows))
