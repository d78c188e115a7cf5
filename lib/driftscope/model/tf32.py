"""TF32 emulation: float32 operands rounded to TF32's 10-bit mantissa before a float32-accumulated product.

On NVIDIA GPUs ``allow_tf32`` makes matmuls and convolutions read their float32 operands as TF32
(8-bit exponent, 10-bit mantissa) and accumulate in float32. torch's CPU matmuls ignore ``allow_tf32``
(and transformers never turns TF32 on for the CPU), so a CPU reference is IEEE float32.
``emulate_tf32`` reproduces the GPU reference's operand rounding on the CPU: the ``transformers`` runtime's
``tf32`` policy, to show how much of a "divergence" is the reference's own TF32.

Rounding is to nearest, ties to even, by default; ``"nearest_away"`` (PTX ``cvt.rna.tf32.f32``) and
``"truncate"`` are the other conventions GPU libraries use. Infinities and NaNs pass unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from driftscope.errors import DriftscopeError

#: Float32 mantissa bits TF32 drops (23 - 10).
DROPPED_BITS = 13
_KEEP = np.uint32((0xFFFFFFFF << DROPPED_BITS) & 0xFFFFFFFF)
MODES = ("nearest_even", "nearest_away", "truncate")


def _check(mode: str) -> None:
    if mode not in MODES:
        raise DriftscopeError(f"unknown TF32 rounding {mode!r}", f"use one of: {', '.join(MODES)}")


def round_to_tf32(x: np.ndarray, mode: str = "nearest_even") -> np.ndarray:
    """``x`` (float32) with every value rounded to a 10-bit mantissa, still stored as float32."""
    _check(mode)
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if mode == "nearest_even":
        bits = bits + (np.uint32(0xFFF) + ((bits >> np.uint32(DROPPED_BITS)) & np.uint32(1)))
    elif mode == "nearest_away":
        bits = bits + np.uint32(0x1000)
    rounded = (bits & _KEEP).view(np.float32)
    return np.where(np.isfinite(x), rounded, x).astype(np.float32)


def round_to_tf32_torch(x: Any, mode: str = "nearest_even") -> Any:
    """The same rounding for a float32 torch tensor (bit operations on its int32 view; other dtypes pass)."""
    import torch

    _check(mode)
    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    if mode == "nearest_even":
        bits = bits + (0xFFF + ((bits >> DROPPED_BITS) & 1))
    elif mode == "nearest_away":
        bits = bits + 0x1000
    rounded = (bits & -(1 << DROPPED_BITS)).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


def tf32_matmul(a: np.ndarray, b: np.ndarray, mode: str = "nearest_even") -> np.ndarray:
    """``a @ b`` with both operands rounded to TF32 and a float32 product."""
    return np.matmul(round_to_tf32(a, mode), round_to_tf32(b, mode))


@contextmanager
def emulate_tf32(mode: str = "nearest_even"):
    """Within the block, torch's ``linear``, ``matmul``, ``bmm`` and ``conv1d/2d/3d`` round float32 operands to TF32.

    Covers nn.Linear and transformers' eager attention; products still run (and accumulate) in float32.
    """
    import torch
    import torch.nn.functional as F

    _check(mode)

    def rounding(function):
        def wrapped(*args, **kwargs):
            args = [round_to_tf32_torch(a, mode) if torch.is_tensor(a) and i < 2 else a for i, a in enumerate(args)]
            if "weight" in kwargs:
                kwargs["weight"] = round_to_tf32_torch(kwargs["weight"], mode)
            return function(*args, **kwargs)

        wrapped.__wrapped__ = function
        return wrapped

    originals = [(F, "linear"), (torch, "matmul"), (torch, "bmm"), (F, "conv1d"), (F, "conv2d"), (F, "conv3d")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in originals]
    try:
        for owner, name, function in saved:
            setattr(owner, name, rounding(function))
        yield
    finally:
        for owner, name, function in saved:
            setattr(owner, name, function)
