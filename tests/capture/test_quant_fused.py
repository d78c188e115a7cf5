"""MLX's fused quantized matmul against dequantize-then-matmul (mlx 0.32.4, CPU), and the same-input replay.

Facts, not timings. The fused CPU kernel is a running sum in the activation dtype: each product
``x * w`` rounded to that dtype, added one after the other (bit-identical to numpy's
``add.accumulate``). So with half activations and half scales 4096 ones through an all-ones weight sum
to 2048 in float16 (2048 + 1 rounds back to 2048) and 256 in bfloat16, where dequantize-then-matmul
gives 4096. In float32 the fused kernel equals dequantize-then-matmul exactly only on the wheel's
bundled reference BLAS, which sums in the same order; OpenBLAS (what driftscope loads for MLX)
blocks its sums and lands nearer float64.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from driftscope.capture.linear_replay import layer_of, replay_linear
from driftscope.model.quant.affine import from_mlx, mlx_core, quantize, to_mlx

HALF_SUMS = {"float16": 2048.0, "bfloat16": 256.0}
NUMPY = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@pytest.fixture(scope="module")
def mx():
    return mlx_core()  # not at import time: driftscope loads OpenBLAS for MLX before mlx.core is imported


def fused_and_dequantized(mx, x, packed, scales, biases, group_size=64, bits=4):
    fused = mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=group_size, bits=bits)
    dense = x @ mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits).T
    mx.eval(fused, dense)
    return fused, dense


def running_sum(x: np.ndarray, weight: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x @ weight.T`` as a sequential sum in ``dtype`` of products rounded to ``dtype`` (numpy only)."""
    products = (x[:, None, :] * weight[None, :, :]).astype(dtype)
    return np.add.accumulate(products, axis=-1, dtype=dtype)[..., -1]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("bits", "group_size", "k"), [(4, 64, 64), (8, 32, 320), (4, 64, 1152), (8, 128, 512)])
def test_fused_kernel_is_a_running_sum_in_the_activation_dtype(mx, dtype, bits, group_size, k):
    rng = np.random.default_rng(k + bits)
    half = getattr(mx, dtype)
    weight = mx.array(rng.standard_normal((12, k)).astype(np.float32) * 0.05)
    packed, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
    scales, biases = scales.astype(half), biases.astype(half)
    x = rng.standard_normal((5, k)).astype(np.float32).astype(NUMPY[dtype])
    fused = mx.quantized_matmul(to_mlx(x), packed, scales, biases, transpose=True, group_size=group_size, bits=bits)
    dense = from_mlx(mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits))
    got, expected = from_mlx(fused), running_sum(x, dense, NUMPY[dtype])
    assert got.dtype == expected.dtype and np.array_equal(got.astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_fused_kernel_accumulates_in_the_half_type(mx, dtype):
    half, fused_sum = getattr(mx, dtype), HALF_SUMS[dtype]
    packed, scales, biases = mx.quantize(mx.ones((64, 4096), dtype=half), group_size=64, bits=4)
    assert scales.dtype == half
    fused, dense = fused_and_dequantized(mx, mx.ones((1, 4096), dtype=half), packed, scales, biases)
    assert fused.dtype == dense.dtype == half
    assert np.all(from_mlx(fused).astype(np.float32) == fused_sum)
    assert np.all(from_mlx(dense).astype(np.float32) == 4096.0)
    # float32 activations through the same codes: exact
    f32 = mx.quantize(mx.ones((64, 4096)), group_size=64, bits=4)
    fused, dense = fused_and_dequantized(mx, mx.ones((1, 4096)), *f32)
    assert np.all(np.array(fused) == 4096.0) and np.all(np.array(dense) == 4096.0)


FLOAT32_PROBE = """
import numpy as np
from driftscope.model.blas import mlx_blas
blas = mlx_blas()
import mlx.core as mx
rng = np.random.default_rng(0)
x = rng.standard_normal((33, {k})).astype(np.float32)
w = mx.array(rng.standard_normal((96, {k})).astype(np.float32) * 0.05)
p, s, b = mx.quantize(w, group_size=64, bits=4)
dense = mx.dequantize(p, s, b, group_size=64, bits=4)
fused = np.array(mx.quantized_matmul(mx.array(x), p, s, b, transpose=True, group_size=64, bits=4))
gemm = np.array(mx.array(x) @ dense.T)
exact = x.astype(np.float64) @ np.array(dense).astype(np.float64).T
print(blas.split()[0], np.abs(fused - gemm).max(), np.abs(fused - exact).max(), np.abs(gemm - exact).max())
"""


def float32_probe(blas: str, k: int) -> tuple[str, float, float, float]:
    """(BLAS, max |fused - gemm|, max |fused - f64|, max |gemm - f64|) in a fresh process on ``blas``."""
    env = {**os.environ, "DRIFTSCOPE_MLX_BLAS": blas}
    if blas != "bundled":
        env.pop("DRIFTSCOPE_MLX_BLAS")
    out = subprocess.run(
        [sys.executable, "-c", FLOAT32_PROBE.format(k=k)], env=env, capture_output=True, text=True, check=True
    )
    name, *numbers = out.stdout.split()
    return name, *(float(n) for n in numbers)


def test_float32_fused_equals_dequantize_then_matmul_only_on_the_reference_blas():
    name, gap, fused_error, gemm_error = float32_probe("bundled", 1152)
    assert name == "bundled" and gap == 0.0 and fused_error == gemm_error > 0
    name, gap, fused_error, gemm_error = float32_probe("default", 1152)
    if name != "openblas":
        pytest.skip(f"no OpenBLAS here ({name}): nothing to contrast")
    assert 0 < gap < 1e-4 and gemm_error < fused_error  # blocked GEMM sums land nearer float64


def test_replay_matches_the_quantized_linear_module_and_blames_the_fused_kernel_in_half(mx):
    import mlx.nn as nn

    rng = np.random.default_rng(0)
    layer = nn.Linear(4096, 64)
    layer.update({"weight": mx.array(rng.standard_normal((64, 4096)).astype(np.float32) * 0.02)})
    quantized = nn.QuantizedLinear.from_linear(layer, group_size=64, bits=4)
    tensor, bias = layer_of(quantized)
    x = rng.standard_normal((8, 4096)).astype(np.float32)

    exact = replay_linear(x, tensor, bias, "float32", name="probe")
    assert np.array_equal(exact.fused, np.array(quantized(mx.array(x))))  # the replay is the module's own call
    assert exact.fused_vs_dequantized < 1e-5 and exact.label == "none"  # float32 round-off either way

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
