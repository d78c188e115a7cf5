"""Error bounds derived from the arithmetic, where a fixed tolerance cannot hold (docs/bounds.md).

A RoPE-rotated stage (``Stage.rotary``) rotates each channel pair by the angle ``theta = p * f``: position ``p``
times the pair's frequency ``f``. A runtime computing ``f = base ** (-2i / d)`` and ``theta`` in float32 gets
``theta`` to within ``u * |theta| * (|ln f| + 4)`` (``u`` = 2**-24, float32's unit roundoff): the exponent
``2i / d`` rounded (``u``, magnified by ``|ln f|`` through the power), the power within one ulp (``2u``), the
reciprocal and the product each rounded once (``u`` each). Rotating by an angle off by ``d theta`` moves the
pair's two values by up to ``|k pair| * d theta``, ``|k pair|`` the pair's norm (which the rotation keeps, so
the reference's rotated values give it). Two runtimes may each be that far off, so an element may differ by

    allowance = 2 * u * |theta| * (|ln f| + 4) * |k pair|

besides the contract's ``atol + rtol * |e|``, which still carries what does not grow with the position (the
cosine and sine themselves, the projections before the rotation). It is nothing at position 0 and grows with
the position (2.0e-3 * |k pair| at position 4,096 in the fastest pair, 9.5e-6 at position 20): a defect as large
as the highest position's round-off placed at a low position stays far outside it. The positions are each
token's largest rotary position (M-RoPE's t, h and w); the angles are float32's in every runtime driftscope
runs, whatever the policy (float64 when both sides are).
"""

from __future__ import annotations

import numpy as np

from driftscope.taps.stages import Rotary, Stage
from driftscope.taps.tapset import TapSet

#: the unit roundoff of the dtype the angles are computed in
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24}
RULE = "|a - e| > atol + rtol * |e| + 2 u |theta| (|ln f| + 4) |k pair|"


def _angle_dtype(tapset: TapSet) -> str:
    policy = tapset.meta.get("policy")
    activations = policy.get("activations") if isinstance(policy, dict) else None
    return "float64" if activations == "float64" else "float32"


class RotaryBound:
    """The position-dependent allowance of one rotary stage of one pair (``rows`` gives it per element)."""

    kind = "rotary round-off"

    def __init__(self, rotary: Rotary, positions: np.ndarray | None, unit: float, shape: tuple[int, ...]):
        self.rotary = rotary
        self.positions = positions
        self.unit = unit
        self.shape = tuple(shape)
        self.axis = rotary.axis % len(shape)
        freq = np.asarray(rotary.inv_freq, dtype=np.float64)
        self.rotated = 2 * freq.size
        per_pair = freq * (np.abs(np.log(freq)) + 4.0)
        self.weight = np.concatenate([per_pair, per_pair]) if rotary.pairing == "half" else np.repeat(per_pair, 2)

    def position(self, index: np.ndarray) -> np.ndarray:
        """Each index's largest rotary position (past the declared ones: one more a step)."""
        index = np.asarray(index, dtype=np.int64)
        if self.positions is None or not self.positions.size:
            return index.astype(np.float64)
        known = self.positions
        last = float(known[-1])
        inside = np.minimum(index, known.size - 1)
        return np.where(index < known.size, known[inside], last + (index - known.size + 1)).astype(np.float64)

    def highest(self) -> float:
        return float(self.position(np.asarray([self.shape[self.axis] - 1]))[0]) if self.shape[self.axis] else 0.0

    def rows(self, expected: np.ndarray, first: int) -> np.ndarray:
        """The allowance of rows ``first:first + len(expected)`` of the stage (its first axis), element by element."""
        e = np.asarray(expected, dtype=np.float64).reshape(-1, *self.shape[1:])
        out = np.zeros(e.shape, dtype=np.float64)
        rotated = min(self.rotated, e.shape[-1])
        if rotated < 2 or e.ndim < 2:
            return out
        half = rotated // 2
        x = e[..., :rotated]
        if self.rotary.pairing == "half":
            norm = np.hypot(x[..., :half], x[..., half:])
            pair = np.concatenate([norm, norm], axis=-1)
        else:
            pair = np.repeat(np.hypot(x[..., 0::2], x[..., 1::2]), 2, axis=-1)
        index = np.arange(first, first + e.shape[0]) if self.axis == 0 else np.arange(e.shape[self.axis])
        where = [1] * e.ndim
        where[self.axis] = index.size
        angle = self.position(index).reshape(where)
        allowance = 2.0 * self.unit * angle * self.weight[:rotated] * pair
        out[..., :rotated] = np.where(np.isfinite(allowance), allowance, 0.0)  # never an inf that passes anything
        return out.reshape(np.asarray(expected).shape)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "rule": RULE,
            "unit_roundoff": self.unit,
            "pairing": self.rotary.pairing,
            "highest_position": self.highest(),
            "positions": self.rotary.positions or "index",
        }


def derived_bound(stage: Stage | None, reference: TapSet, candidate: TapSet) -> RotaryBound | None:
    """The bound the arithmetic of ``stage`` allows beyond the contract for this pair (None: the contract alone)."""
    if stage is None or stage.rotary is None or stage.id not in reference or stage.id not in candidate:
        return None
    shape = tuple(reference.shape(stage.id))
    if len(shape) < 2:
        return None
    rotary = stage.rotary
    positions = None
    if rotary.positions and rotary.positions in reference:
        held = np.asarray(reference[rotary.positions])
        if held.size:
            positions = held.reshape(-1, held.shape[-1]).max(axis=0).astype(np.float64)
    both = {_angle_dtype(reference), _angle_dtype(candidate)}
    unit = UNIT_ROUNDOFF["float64"] if both == {"float64"} else UNIT_ROUNDOFF["float32"]
    return RotaryBound(rotary, positions, unit, shape)


def bound_record(bound: RotaryBound | None, contract_failures: int, failures: int) -> tuple[str, dict | None]:
    """What a row says judged it: ``contract`` where the contract alone decided every element, else the derived
    bound, with how many elements only it let pass."""
    if bound is None:
        return "contract", None
    detail = {**bound.describe(), "contract_failures": contract_failures}
    detail["passed_by_bound"] = contract_failures - failures
    return (bound.kind if contract_failures > failures else "contract"), detail
