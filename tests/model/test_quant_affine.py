"""numpy dequantization is bit-identical to mx.dequantize (values and dtype); mx.quantize round trips."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from driftscope.model.quant.affine import (
    QuantizedTensor,
    dequantize,
    from_mlx,
    mlx_core,
    numpy_dtype,
    quantize,
    to_mlx,
    unpack,
)


@pytest.fixture(scope="module")
def mx():
    return mlx_core()  # not at import time: driftscope loads OpenBLAS for MLX before mlx.core is imported


def mlx_dtype_name(array) -> str:
    return str(array.dtype).rsplit(".", 1)[-1]


@pytest.mark.parametrize(("bits", "group_size"), list(itertools.product((2, 4, 8), (32, 64, 128))))
@pytest.mark.parametrize("scales", ["float32", "float16", "bfloat16"])
def test_dequantize_is_bit_identical_to_mlx(mx, bits, group_size, scales):
    rng = np.random.default_rng(bits * 1000 + group_size)
    for _ in range(3):
        rows = int(rng.integers(1, 40))
        cols = group_size * int(rng.integers(1, 6))
        scale = float(rng.choice([1e-3, 1.0, 30.0]))
        dense = mx.array((rng.standard_normal((rows, cols)) * scale).astype(np.float32)).astype(getattr(mx, scales))
        packed, s, b = mx.quantize(dense, group_size=group_size, bits=bits)
        expected = mx.dequantize(packed, s, b, group_size=group_size, bits=bits)
        got = dequantize(from_mlx(packed), from_mlx(s), from_mlx(b), group_size, bits)
        assert got.dtype == numpy_dtype(mlx_dtype_name(expected)) == numpy_dtype(scales)
        assert got.shape == tuple(expected.shape)
        # compare the bits, not the values: -0.0 vs 0.0 or a different NaN would show
        assert np.array_equal(got.view(f"u{got.itemsize}"), from_mlx(expected).view(f"u{got.itemsize}"))


@pytest.mark.parametrize(("scales", "out"), [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32")])
def test_dequantize_dtype_argument_matches_mlx(mx, scales, out):
    rng = np.random.default_rng(7)
    dense = mx.array(rng.standard_normal((24, 256)).astype(np.float32) * 5).astype(getattr(mx, scales))
    packed, s, b = mx.quantize(dense, group_size=64, bits=4)
    expected = mx.dequantize(packed, s, b, group_size=64, bits=4, dtype=getattr(mx, out))
    got = dequantize(from_mlx(packed), from_mlx(s), from_mlx(b), 64, 4, dtype=out)
    assert got.dtype == numpy_dtype(out)
    assert np.array_equal(got.view(f"u{got.itemsize}"), from_mlx(expected).view(f"u{got.itemsize}"))


def test_quantize_wraps_mx_quantize_and_casting_scales_equals_set_dtype(mx):
    import mlx.nn as nn

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((16, 128)).astype(np.float32)
    tensor = quantize(weight, 64, 4)
    assert tensor.packed.dtype == np.uint32 and tensor.packed.shape == (16, 16)
    assert tensor.scales.shape == (16, 2) and tensor.scales.dtype == np.float32 and tensor.shape == (16, 128)
    # MLX's affine codes land within one step (the group's scale) of every value (its zero point is snapped)
    step = np.repeat(np.abs(tensor.scales), 64, axis=1)
    assert np.all(np.abs(tensor.dequantize() - weight) <= step * (1 + 1e-6))
    codes = unpack(tensor.packed, 4)
    assert codes.min() >= 0 and codes.max() <= 15 and codes.shape == (16, 128)
    # what mx's own QuantizedLinear.set_dtype(float16) computes with
    layer = nn.QuantizedLinear(128, 16, bias=False, group_size=64, bits=4)
    layer.update({"weight": to_mlx(tensor.packed), "scales": to_mlx(tensor.scales), "biases": to_mlx(tensor.biases)})
    layer.set_dtype(mx.float16)
    cast = tensor.with_scale_dtype("float16")
    assert cast.scales.dtype == np.float16
    expected = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=64, bits=4)
    assert np.array_equal(cast.dequantize(), from_mlx(expected))


def test_bfloat16_round_trips_between_numpy_and_mlx(mx):
    values = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=ml_dtypes.bfloat16)
    back = from_mlx(to_mlx(values))
    assert back.dtype == values.dtype and np.array_equal(back.view(np.uint16), values.view(np.uint16))


def test_inconsistent_tensors_are_named():
    tensor = quantize(np.ones((4, 128), dtype=np.float32), 64, 4)
    with pytest.raises(ValueError, match="group size 32 cover 64"):
        QuantizedTensor(tensor.packed, tensor.scales, tensor.biases, 32, 4)
    with pytest.raises(ValueError, match="3-bit codes are not supported"):
        dequantize(tensor.packed, tensor.scales, tensor.biases, 64, 3)
    with pytest.raises(ValueError, match="scales .* and biases .* differ"):
        QuantizedTensor(tensor.packed, tensor.scales, tensor.biases.astype(np.float16), 64, 4)
    with pytest.raises(ValueError, match="no floating dtype 'float64'"):
        numpy_dtype("float64")
