"""The precision search in every family (issue 36, item 3): each family's ``precision`` module names the operators
its stage plan computes, where mlx-vlm holds them, and what the emitters widen; the search code names no family.

Fast: every family's operator kinds per runtime (from its plan), and on MLX every operator of Qwen3-VL, its MoE
variant and Molmo2 resolves to the module mlx-vlm computes it with, widens to float32 (one checked against float64
numpy on the float16 weights) and is put back. Slow (``tests/replay/test_precision_search_families.py``): a search
per family on its tiny fixture.
"""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import ParameterError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "molmo2")


def _plan(name: str):
    family = get_family(name)
    checkpoint = open_checkpoint(family.tiny.ensure())
    return family, checkpoint, family.vision_plan(checkpoint.config)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_names_its_operators_from_its_plan(name):
    """Each block kind is a substage of the plan's block 0 (or the fused projection computing several), each tower
    operator a stage of the plan or the stage holding it; the emitters widen at least what MLX does in the blocks,
    and the module says why the text side has no operator kinds (the plans tap layer outputs only)."""
    family, _, plan = _plan(name)
    ids = {stage.id for stage in plan}
    module = family.precision_module()
    assert "text.layer.N" in module.TEXT and "no text operator kinds" in module.TEXT
    assert not any(stage.substage for stage in family.text_stages(_plan(name)[1].config, 2))  # what TEXT says
    kinds = {}
    for runtime in ("mlx", "iree", "jax"):
        operators = family.precision_operators(runtime, plan)
        assert len(operators) == len(set(operators)) and operators, runtime
        for op in operators:
            stage = op.format(b=0)
            assert stage in ids or any(stage.startswith(s + ".") for s in ids), (runtime, op)
        kinds[runtime] = operators
    assert kinds["iree"] == kinds["jax"]
    blocks = lambda ops: {op for op in ops if "{b}" in op}  # noqa: E731
    assert blocks(kinds["mlx"]) - blocks(kinds["iree"]) <= {
        "vision.block.{b}.mlp.act"
    }  # elementwise, f32 in the emitter
    assert "vision.block.{b}.norm2" in kinds["mlx"] and "vision.patch_embed" in kinds["mlx"]
    assert family.precision_operators("transformers", plan) == []  # the oracle runs float32 already


@pytest.mark.parametrize("name", ("qwen3_vl", "qwen3_vl_moe", "molmo2"))
def test_mlx_widens_each_operator_of_the_family_and_puts_it_back(name):
    """Every MLX operator of the family, in every block, resolves to an mlx-vlm module and becomes a Float32Call;
    the undo restores each one. Block 0's norm2 (a LayerNorm) then computes in float32 what float64 numpy does on
    the float16 weights, to float16 output rounding."""
    import mlx.core as mx
    from driftscope.capture.runtimes import get_runtime
    from driftscope.model.mixed import expand

    family, checkpoint, plan = _plan(name)
    policy = "f32" if name == "qwen3_vl_moe" else "f16"  # MLX's CPU gather_mm (the experts) is float32 only
    runtime = get_runtime("mlx")(checkpoint, policy)
    runtime.load()
    operators = family.precision_operators("mlx", plan)
    every = expand([op.replace("{b}", f"0-{plan.depth - 1}") for op in operators])
    sites = family.precision_module().mlx_sites(runtime.model, list(every))
    before = [owner[key] if isinstance(owner, list) else getattr(owner, key) for owner, key in sites]
    undo = runtime.keep_float32(list(every))
    after = [owner[key] if isinstance(owner, list) else getattr(owner, key) for owner, key in sites]
    assert {type(item).__name__ for item in after} == {"Float32Call"} and len(after) == len(every)
    if policy == "f16":
        wide = after[list(every).index("vision.block.0.norm2")]
        weight, bias = (np.asarray(wide.inner.weight.astype(mx.float32), np.float64), None)
        bias = np.asarray(wide.inner.bias.astype(mx.float32), np.float64) if "bias" in wide.inner else 0.0
        x = np.random.default_rng(0).normal(0, 3, (8, weight.shape[0])).astype(np.float16)
        x64 = x.astype(np.float64)
        mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
        expected = (x64 - mean) / np.sqrt(var + wide.inner.eps) * weight + bias
        got = wide(mx.array(x))
        assert got.dtype == mx.float16
        np.testing.assert_allclose(np.asarray(got.astype(mx.float32)), expected, rtol=1e-3, atol=2e-3)
    undo()
    restored = [owner[key] if isinstance(owner, list) else getattr(owner, key) for owner, key in sites]
    assert all(a is b for a, b in zip(restored, before, strict=True))
    with pytest.raises(ParameterError, match="cannot compute in float32 alone"):
        family.precision_module().mlx_sites(runtime.model, ["vision.block.0.attn.context"])
    runtime.release()
