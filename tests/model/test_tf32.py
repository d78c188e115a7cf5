"""TF32 operand rounding against an independent numpy reference (frexp/ldexp), and its emulation in torch."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import DriftscopeError
from driftscope.model.tf32 import emulate_tf32, round_to_tf32, round_to_tf32_torch, tf32_matmul


def reference_round(x: np.ndarray) -> np.ndarray:
    """Normal float32 values to 11 significant bits (1 + 10), ties to even, via frexp (not bit arithmetic)."""
    mantissa, exponent = np.frexp(x.astype(np.float64))  # x = m * 2**e, 0.5 <= |m| < 1
    return np.ldexp(np.round(mantissa * 2.0**11), exponent - 11).astype(np.float32)  # np.round: ties to even


def random_normals(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)).astype(np.float32)


def test_rounding_equals_the_frexp_reference():
    x = random_normals(200_000)
    np.testing.assert_array_equal(round_to_tf32(x), reference_round(x))
    assert (round_to_tf32(x).view(np.uint32) & 0x1FFF == 0).all()
    np.testing.assert_array_equal(round_to_tf32(round_to_tf32(x)), round_to_tf32(x))


def test_ties_and_special_values():
    ulp = 2.0**-10  # TF32 spacing in [1, 2)
    ties = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 + 2**-20], dtype=np.float32)
    assert round_to_tf32(ties).tolist() == [1.0, 1 + 2 * ulp, -1.0, 1 + ulp]
    assert round_to_tf32(ties, "nearest_away").tolist()[:3] == [1 + ulp, 1 + 2 * ulp, -(1 + ulp)]
    assert round_to_tf32(ties, "truncate").tolist() == [1.0, 1 + ulp, -1.0, 1.0]
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dtype=np.float32)
    out = round_to_tf32(special)
    assert np.isinf(out[:2]).all() and np.isnan(out[2]) and out[3] == 0 and np.signbit(out[4])
    with pytest.raises(DriftscopeError, match="TF32 rounding"):
        round_to_tf32(ties, "stochastic")


@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "truncate"])
def test_torch_rounding_equals_numpy(mode):
    import torch

    x = random_normals(50_000, 1)
    np.testing.assert_array_equal(round_to_tf32_torch(torch.from_numpy(x), mode).numpy(), round_to_tf32(x, mode))


def test_emulated_linear_and_matmul_match_the_numpy_reference():
    import torch

    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    expected = reference_round(x).astype(np.float64) @ reference_round(w).astype(np.float64).T
    linear = torch.nn.Linear(256, 96, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(w))
        plain = linear(torch.from_numpy(x)).numpy()
        with emulate_tf32():
            emulated = linear(torch.from_numpy(x)).numpy()
            product = torch.matmul(torch.from_numpy(x), torch.from_numpy(w).T).numpy()
        after = linear(torch.from_numpy(x)).numpy()
    scale = np.abs(expected).max()
    assert np.abs(emulated - expected).max() / scale < 1e-6  # only float32 accumulation separates them
    assert np.abs(product - expected).max() / scale < 1e-6
    assert np.abs(tf32_matmul(x, w.T) - expected).max() / scale < 1e-6
    assert np.abs(plain - expected).max() / scale > 1e-4  # TF32 operands are measurably coarser
    np.testing.assert_array_equal(after, plain)  # restored on exit


def test_a_tf32_reference_of_molmo2_moves_from_the_first_matmul_on():
    """The tiny Molmo2 through the transformers runtime's ``tf32`` policy against its own float32 forward (how
    much a TF32 oracle moves)."""
    from molmo2_support import capture, errors

    measured = errors(capture("transformers", "224"), capture("transformers", "224", policy="tf32"))
    assert next(stage for stage, error in measured.items() if error >= 1e-4) == "vision.patch_embed"
    assert 1e-4 < measured["vision.patch_embed"] < 5e-3  # 6.9e-4 measured
    assert 5e-4 < measured["vision.block.0"] < 1e-2  # 2.6e-3: an order below mlx-vlm's fast GELU (2.1e-2)
