"""Numbers several layers share: a logit margin and the band a policy allows it, a relative RMS error, and the
check of a user's ratio or floor."""

from __future__ import annotations

import math

import numpy as np

from driftscope.errors import ParameterError


def top2_margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit (a near-tie is a small margin)."""
    top = np.sort(np.asarray(logits, dtype=np.float64))[-2:]
    return float(top[1] - top[0])


#: mantissa bits of the dtypes a policy computes in (one unit of least precision at x: 2**(floor(log2|x|) - bits))
MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}


def ulp(value: float, dtype: str) -> float:
    """One unit of least precision of ``value`` in ``dtype`` (float32's when the dtype is not known)."""
    bits = MANTISSA_BITS.get(str(dtype), 23)
    magnitude = abs(float(value))
    if not math.isfinite(magnitude) or magnitude == 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) - bits)


def margin_band(top: float, other: float, atol: float, rtol: float, dtype: str) -> float:
    """The error a runtime computing in ``dtype`` may make on the margin between two logits: each one's tolerance
    ``atol + rtol * |x|`` at its magnitude, but at least one unit of least precision of each in ``dtype``. A margin
    at most this is a near tie: a precision the contract allows could flip it."""
    return float(sum(max(atol + rtol * abs(float(value)), ulp(value, dtype)) for value in (top, other)))


def relative_rms(actual: np.ndarray, expected: np.ndarray) -> float:
    """``rms(actual - expected) / rms(expected)`` in float64 (0 when equal, inf against an all-zero reference)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {e.shape}")
    error = float(np.sqrt(np.mean((a - e) ** 2))) if a.size else 0.0
    scale = float(np.sqrt(np.mean(e**2))) if e.size else 0.0
    return error / scale if scale > 0 else (0.0 if error == 0 else float("inf"))


#: the largest ratio or floor a gate may be given: past it (1e308: overflows) nothing would count against a run
CEILING = 1e3


def checked_ratio(value: object, where: str, example: str = "1.5") -> float:
    """``value`` as a finite ratio above zero and at most :data:`CEILING` (a factor a change or an error is measured
    against), else a clear error: a NaN or huge factor makes every comparison false, so nothing would count."""
    number = _number(value, where, example)
    if not number > 0:
        raise ParameterError(f"{where} must be a finite number above 0, got {value!r}", f"write e.g. {example}")
    return _capped(number, value, where, example)


def checked_floor(value: object, where: str, example: str = "1e-6") -> float:
    """``value`` as a finite number at least zero and at most :data:`CEILING` (a noise floor), else a clear error."""
    number = _number(value, where, example)
    if not number >= 0:
        raise ParameterError(f"{where} must be a finite number of at least 0, got {value!r}", f"write e.g. {example}")
    return _capped(number, value, where, example)


def _capped(number: float, value: object, where: str, example: str) -> float:
    if number > CEILING:
        raise ParameterError(
            f"{where} {value!r} judges nothing (over {CEILING:g}, no error or change would count)",
            f"write a number up to {CEILING:g}, e.g. {example}",
        )
    return number


def _number(value: object, where: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParameterError(f"{where} must be a number, got {type(value).__name__} {value!r}", f"write e.g. {example}")
    if not math.isfinite(value):
        raise ParameterError(f"{where} must be finite, got {value!r}", f"write e.g. {example}")
    return float(value)
