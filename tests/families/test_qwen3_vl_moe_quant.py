"""Qwen3-VL-MoE in 4 bits (issue 32): the stacked experts are quantized like every other matrix.

The checkpoint stores a sparse layer's experts as ``experts.gate_up_proj`` [experts, hidden, 2 x intermediate] and
``experts.down_proj`` [experts, intermediate, hidden]; mlx-vlm holds them as ``switch_mlp.gate_proj``/``up_proj``/
``down_proj`` [experts, out, in]. The family's name map splits and joins them exactly; a dense checkpoint's experts
quantized on the host carry the codes ``nn.quantize`` gives the loaded MLX model; on the tiny q4 fixture
(``make_tiny_q4.py``: every matrix in 4 bits, experts included) MLX's fused ``q4`` agrees with the dequantized
oracle at every stage, the router's choice exactly (slow). MLX's CPU ``gather_mm`` runs float32 only: dense experts
in half precision are refused before the capture, naming the limit and the fix.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import ROOT
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import RuntimeUnavailableError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
from driftscope.model.quant.policy import QuantSpec
from driftscope.model.weightfile import TensorFiles

NAME = "qwen3_vl_moe"
LAYER = "model.language_model.layers.0.mlp.experts"


@pytest.fixture(scope="module")
def family():
    return get_family(NAME)


@pytest.fixture(scope="module")
def q4(family):
    from make_tiny_q4 import ensure_q4

    return open_checkpoint(ensure_q4(family))


def test_the_name_map_splits_and_joins_the_stacked_experts_exactly(family):
    names = family.quant_profile().mlx_names
    files = TensorFiles(family.tiny.ensure())
    stored = {name: files.read(name) for name in files.names() if ".layers.0." in name}
    mlx = names.weights_to_mlx(stored)
    prefix = "language_model.model.layers.0.mlp.switch_mlp"
    gate_up, down = stored[f"{LAYER}.gate_up_proj"], stored[f"{LAYER}.down_proj"]
    width = gate_up.shape[-1] // 2
    # mlx-vlm's own sanitize: gate = [..., :width], up = [..., width:], each transposed to [experts, out, in]
    np.testing.assert_array_equal(mlx[f"{prefix}.gate_proj.weight"], gate_up[..., :width].transpose(0, 2, 1))
    np.testing.assert_array_equal(mlx[f"{prefix}.up_proj.weight"], gate_up[..., width:].transpose(0, 2, 1))
    np.testing.assert_array_equal(mlx[f"{prefix}.down_proj.weight"], down.transpose(0, 2, 1))
    back = names.weights_to_checkpoint(mlx)
    assert set(back) == set(stored) and all(np.array_equal(back[n], stored[n]) for n in stored)
    assert names.to_checkpoint(f"{prefix}.up_proj.weight") == f"{LAYER}.gate_up_proj"
    np.testing.assert_array_equal(
        names.part_from_checkpoint(f"{prefix}.up_proj.weight", stored.__getitem__), mlx[f"{prefix}.up_proj.weight"]
    )


def test_a_dense_checkpoints_experts_quantize_on_the_host_as_mlx_quantizes_the_loaded_model(family):
    """Host quantization splits ``gate_up_proj`` into MLX's parts and layout, quantizes them and joins the
    dequantized parts back: bit for bit ``mx.dequantize`` of the MLX model ``nn.quantize`` quantized on load. The
    tiny fixture's 48-wide down projections stay dense at group size 64 and are reported with the reason."""
    import mlx.core as mx
    from driftscope.model.quant.host import quantize_checkpoint
    from driftscope.model.quant.mlx_checkpoint import quantize_loaded

    profile = family.quant_profile()
    checkpoint = open_checkpoint(family.tiny.ensure())
    spec = QuantSpec(bits=4, group_size=64, scope="text")
    host = quantize_checkpoint(checkpoint.path, profile.checkpoint, spec, profile.mlx_names, profile.mlx)
    dense = host.dequantized()
    model = family.engine("mlx").load(checkpoint.path, checkpoint.config)
    model.set_dtype(mx.float32)
    selection = quantize_loaded(model, profile.mlx, spec)
    assert set(selection.quantized) == {
        profile.mlx_names.to_mlx(n) if n in dense else n for n in host.selection.quantized
    }
    layer = model.language_model.model.layers[0].mlp.switch_mlp
    width = layer.gate_proj.weight.shape[1]
    for index, part in enumerate((layer.gate_proj, layer.up_proj)):
        expected = np.array(mx.dequantize(part.weight, part.scales, part.biases, part.group_size, part.bits))
        joined = dense[f"{LAYER}.gate_up_proj"][..., index * width : (index + 1) * width]
        np.testing.assert_array_equal(joined.transpose(0, 2, 1), expected)
    assert "scales" not in layer.down_proj and f"{LAYER}.down_proj" not in dense
    left = {row.name: row for row in host.selection.left_dense}
    assert left["language_model.model.layers.0.mlp.switch_mlp.down_proj.weight"].input_width == 48


def test_the_q4_fixture_quantizes_every_expert(q4, family):
    """Every stacked expert of the q4 fixture is a quantized layer; none is left dense."""
    from driftscope.model.quant.mlx_checkpoint import MLXQuantizedCheckpoint

    stored = MLXQuantizedCheckpoint(q4.path)
    experts = [path for path in stored.layers if ".switch_mlp." in path]
    layers = q4.config["text_config"]["num_hidden_layers"]
    assert len(experts) == 3 * layers
    assert stored.left_dense(family.quant_profile().mlx) == []


@pytest.mark.parametrize(
    "fixture, policy, refused",
    [("dense", "bf16", True), ("q4", "q4-dequant-f16", True), ("q4", "q4-bf16", False), ("dense", "f32", False)],
)
def test_dense_experts_in_half_precision_on_mlx_cpu_are_refused_before_the_capture(
    fixture, policy, refused, family, q4, tmp_path
):
    """mlx-vlm's dense experts run ``mx.gather_mm``, which MLX's CPU backend computes in float32 only: a text
    capture that would run them in half precision is refused with the limit and the fix before anything is written
    (fused quantized experts run ``mx.gather_qmm``, which takes half precision)."""
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import prepare_inputs

    checkpoint = q4 if fixture == "q4" else open_checkpoint(family.tiny.ensure())
    inputs = prepare_inputs(checkpoint, list(family.tiny.images))
    inputs.text = family.text_inputs(checkpoint, inputs, prompt="Name the shapes.", max_new_tokens=2)
    plan = stage_plan(NAME, checkpoint.config)
    text_plan = type(plan)(plan.family, plan.stages + family.text_stages(checkpoint.config, 2), plan.depth)
    runtime = get_runtime("mlx")(checkpoint, policy)
    runtime.load()
    if refused:
        with pytest.raises(RuntimeUnavailableError) as caught:
            runtime.check_capture(inputs, text_plan)
        message = str(caught.value)
        assert "computes mx.gather_mm" in message and "float32 only" in message and policy in message
        assert "policy f32" in message and "q4-bf16" in message and "other runtimes still run" in message
    else:
        runtime.check_capture(inputs, text_plan)
    runtime.check_capture(inputs, plan)  # a vision-only capture never reaches the experts
    runtime.release()


@pytest.mark.slow
def test_a_q4_run_compares_every_stage_within_the_strict_contract(q4, tmp_path):
    """``driftscope run`` of ``parameters/demo_qwen3_vl_moe_q4.yaml`` (without its notebooks): MLX's fused q4 and
    the same codes dequantized, float32 activations, against the dequantized transformers oracle, every stage of
    tower and text (the router's logits, its choice compared exactly, the weights, each chosen expert's output)
    within 1e-4; the report records the experts among the quantized layers."""
    from driftscope.cli import main
    from driftscope.run.report import Report

    demo = yaml.safe_load((ROOT / "parameters" / "demo_qwen3_vl_moe_q4.yaml").read_text())
    assert demo["checkpoint"].endswith(q4.path.name)
    demo.update(
        checkpoint=str(q4.path),
        images=[str(ROOT / image) for image in demo["images"]],
        contract=str(ROOT / demo["contract"]),
        notebooks=[],
    )
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump(demo))
    main(["run", str(params), "--out", str(tmp_path / "run"), "--no-gate"])
    report = Report.load(tmp_path / "run")
    planned = {stage["id"] for stage in report.data["stage_plan"]}
    layers = q4.config["text_config"]["num_hidden_layers"]
    for pair in report.pair_keys():
        rows = [row for row in report.rows if row.pair == pair]
        stages = {row.stage for row in rows}
        pieces = ("router", "chosen", "weights", "experts")
        assert {f"text.layer.{i}.mlp.{p}" for i in range(layers) for p in pieces} <= stages, pair
        assert stages == planned, (pair, sorted(planned - stages))  # every planned stage compared
        coverage = report.data["coverage"][rows[0].candidate]
        assert coverage["compared"] == coverage["stages"] == len(planned) and coverage["complete"], coverage
        assert all(row.status == "pass" for row in rows), (pair, [r for r in rows if r.status != "pass"][:3])
        assert all(row.max_abs == 0 for row in rows if row.stage.endswith(".mlp.chosen"))
    runtime = next(r for r in report.data["runtimes"] if r.get("label") == "mlx:q4")
    assert runtime["quantization"]["quantized"]["text"] == layers * 8 + 2  # q, k, v, o, router, 3 experts; embed, head
