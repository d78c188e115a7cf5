"""MLX's fused quantized matmul against dequantize-then-matmul (mlx 0.32.4, CPU), and the same-input replay.

Facts, not timings: with float32 activations the two paths agree exactly; with half activations and
half scales the fused CPU kernel accumulates in the half type, so 4096 ones through an all-ones
weight sum to 2048 in float16 (2048 + 1 rounds back to 2048) and 256 in bfloat16 (8 mantissa bits).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from driftscope.quant.affine import from_mlx, quantize, to_mlx
from driftscope.quant.linear_replay import layer_of, replay_linear

HALF = {"float16": (mx.float16, 2048.0), "bfloat16": (mx.bfloat16, 256.0)}


def fused_and_dequantized(x, packed, scales, biases, group_size=64, bits=4):
    fused = mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=group_size, bits=bits)
    dense = x @ mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits).T
    mx.eval(fused, dense)
    return fused, dense


@pytest.mark.parametrize(("bits", "group_size", "k"), [(4, 64, 1152), (8, 64, 4096), (4, 32, 320), (8, 128, 512)])
def test_float32_fused_equals_dequantize_then_matmul_exactly(bits, group_size, k):
    rng = np.random.default_rng(k)
    weight = mx.array(rng.standard_normal((96, k)).astype(np.float32) * 0.05)
    x = mx.array(rng.standard_normal((33, k)).astype(np.float32))
    packed, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
    fused, dense = fused_and_dequantized(x, packed, scales, biases, group_size, bits)
    assert fused.dtype == mx.float32
    assert np.array_equal(np.array(fused), np.array(dense))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_fused_kernel_accumulates_in_the_half_type(dtype):
    half, fused_sum = HALF[dtype]
    packed, scales, biases = mx.quantize(mx.ones((64, 4096), dtype=half), group_size=64, bits=4)
    assert scales.dtype == half
    fused, dense = fused_and_dequantized(mx.ones((1, 4096), dtype=half), packed, scales, biases)
    assert fused.dtype == dense.dtype == half
    assert np.all(from_mlx(fused).astype(np.float32) == fused_sum)
    assert np.all(from_mlx(dense).astype(np.float32) == 4096.0)
    # float32 activations through the same codes: exact
    f32 = mx.quantize(mx.ones((64, 4096)), group_size=64, bits=4)
    fused, dense = fused_and_dequantized(mx.ones((1, 4096)), *f32)
    assert np.all(np.array(fused) == 4096.0) and np.all(np.array(dense) == 4096.0)


def test_replay_matches_the_quantized_linear_module_and_blames_the_fused_kernel_in_half():
    rng = np.random.default_rng(0)
    layer = nn.Linear(4096, 64)
    layer.update({"weight": mx.array(rng.standard_normal((64, 4096)).astype(np.float32) * 0.02)})
    quantized = nn.QuantizedLinear.from_linear(layer, group_size=64, bits=4)
    tensor, bias = layer_of(quantized)
    x = rng.standard_normal((8, 4096)).astype(np.float32)

    exact = replay_linear(x, tensor, bias, "float32", name="probe")
    assert np.array_equal(exact.fused, np.array(quantized(mx.array(x))))  # the replay is the module's own call
    assert exact.fused_vs_dequantized == 0.0 and exact.label == "none"

    reference = exact.dequantized  # float32 through the same quantized weights: the oracle's output
    half = replay_linear(x, tensor, bias, "float16", reference=reference, name="probe")
    module = nn.QuantizedLinear.from_linear(layer, group_size=64, bits=4)
    module.set_dtype(mx.float16)
    assert np.array_equal(half.fused, from_mlx(module(mx.array(x).astype(mx.float16))).astype(np.float32))
    row = half.to_dict()
    assert row["fused_vs_reference"] > 4 * row["dequantized_vs_reference"] > 0
    assert row["label"] == "fused kernel" and row["activations"] == "float16"

    ones = quantize(np.ones((64, 4096), dtype=np.float32), 64, 4)
    summed = replay_linear(
        np.ones((1, 4096), dtype=np.float32), ones, None, "bfloat16", reference=np.full((1, 64), 4096.0)
    )
    assert np.all(summed.fused == 256.0) and np.all(summed.dequantized == 4096.0)
    assert summed.to_dict()["dequantized_vs_reference"] == 0.0 and summed.label == "fused kernel"
    assert to_mlx(summed.fused).dtype == mx.float32
