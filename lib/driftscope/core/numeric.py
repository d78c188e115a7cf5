"""Two numbers several layers ask of arrays: a logit margin and a relative RMS error."""

from __future__ import annotations

import numpy as np


def top2_margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit (a near-tie is a small margin)."""
    top = np.sort(np.asarray(logits, dtype=np.float64))[-2:]
    return float(top[1] - top[0])


def relative_rms(actual: np.ndarray, expected: np.ndarray) -> float:
    """``rms(actual - expected) / rms(expected)`` in float64 (0 when equal, inf against an all-zero reference)."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {e.shape}")
    error = float(np.sqrt(np.mean((a - e) ** 2))) if a.size else 0.0
    scale = float(np.sqrt(np.mean(e**2))) if e.size else 0.0
    return error / scale if scale > 0 else (0.0 if error == 0 else float("inf"))
