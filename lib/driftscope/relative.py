"""A verdict relative to the oracle's own error: judge a candidate against a float64 run.

A stage passes when RMSE(candidate, high) <= factor * RMSE(oracle, high) + floor, where ``high`` is
the float64 oracle and ``oracle`` the float32 one: a candidate may be as wrong as the oracle is,
times a margin, but no more.
"""

from __future__ import annotations

from .compare import compare_tapsets
from .contract import Contract
from .stages import StagePlan
from .tapset import TapSet


def relative_verdict(
    high: TapSet, oracle: TapSet, candidates: list[TapSet], plan: StagePlan, factor: float = 4.0, floor: float = 1e-6
) -> dict:
    """Per candidate and stage: both RMSEs against ``high``, the bound, and pass/fail."""
    loose = Contract.from_dict({"default": {"atol": 1e30, "rtol": 0.0}})
    oracle_rms = {row.stage: row.rms for row in compare_tapsets(high, oracle, loose, plan) if not row.integer}
    out: dict = {"high": high.label, "oracle": oracle.label, "factor": factor, "floor": floor, "candidates": {}}
    for candidate in candidates:
        stages, first = [], None
        for row in compare_tapsets(high, candidate, loose, plan):
            if row.integer or row.stage not in oracle_rms or row.status not in ("pass", "fail"):
                continue
            bound = factor * oracle_rms[row.stage] + floor
            passed = row.rms <= bound
            stages.append(
                {
                    "stage": row.stage,
                    "candidate_rmse": row.rms,
                    "oracle_rmse": oracle_rms[row.stage],
                    "bound": bound,
                    "status": "pass" if passed else "fail",
                }
            )
            if not passed and first is None:
                first = row.stage
        out["candidates"][candidate.label] = {
            "status": "fail" if first else "pass",
            "first_failure": first,
            "stages": stages,
        }
    return out
