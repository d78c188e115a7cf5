"""Verdicts relative to another runtime's own error, besides the contract's absolute tolerances.

- Against a float64 run: a stage passes when RMSE(candidate, high) <= factor * RMSE(oracle, high) + floor,
  where ``high`` is the float64 oracle and ``oracle`` the float32 one: a candidate may be as wrong as the
  oracle is, times a margin, but no more.
- Against a trusted peer (``relative: {peer: mlx:f32}``), as Ascend's msprobe judges NPU-vs-CPU against
  GPU-vs-CPU: a stage passes when RMSE(candidate, reference) <= peer_factor * RMSE(peer, reference) +
  peer_floor, with ``peer_factor`` and ``peer_floor`` declared per stage pattern in the contract. Both are
  recorded next to the verdict; neither changes it.
"""

from __future__ import annotations

from driftscope.judge.compare import ComparisonRow, compare_tapsets
from driftscope.judge.contract import Contract, Tolerance
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet


def relative_verdict(
    high: TapSet, oracle: TapSet, candidates: list[TapSet], plan: StagePlan, factor: float = 4.0, floor: float = 1e-6
) -> dict:
    """Per candidate and stage: both RMSEs against ``high``, the bound, and pass/fail."""
    # only the RMS errors are read: the rows' own pass/fail is not this verdict's (no user contract is made here,
    # so the parameters step's refusal of contracts that judge nothing does not apply)
    loose = Contract("rmse-only", Tolerance(atol=1e30, rtol=0.0))
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


def peer_verdict(rows: list[ComparisonRow], reference: str, peer: str, contract: Contract, plan: StagePlan) -> dict:
    """Per candidate and stage: its RMSE against the reference, the peer's, the contract's bound, pass/fail.
    ``rows``: the report's comparison rows (each pair's key in ``row.pair``, the candidate's label when judged
    against the main reference)."""
    by_pair: dict[str, dict[str, ComparisonRow]] = {}
    for row in rows:
        if row.reference == reference:
            by_pair.setdefault(row.candidate, {})[row.stage] = row
    trusted = by_pair.get(peer, {})
    out: dict = {"reference": reference, "peer": peer, "candidates": {}}
    for candidate, stages_of in by_pair.items():
        if candidate == peer:
            continue
        stages, first = [], None
        for stage_id, row in stages_of.items():
            peer_row = trusted.get(stage_id)
            declared = plan[stage_id] if stage_id in plan else None
            if peer_row is None or row.integer or (declared is not None and declared.data):
                continue
            if row.status not in ("pass", "fail") or peer_row.status not in ("pass", "fail"):
                continue
            tolerance = contract.tolerance(stage_id)
            bound = tolerance.peer_factor * peer_row.rms + tolerance.peer_floor
            passed = row.rms <= bound
            stages.append(
                {
                    "stage": stage_id,
                    "candidate_rmse": row.rms,
                    "peer_rmse": peer_row.rms,
                    "factor": tolerance.peer_factor,
                    "floor": tolerance.peer_floor,
                    "bound": bound,
                    "ratio": row.rms / peer_row.rms if peer_row.rms > 0 else None,
                    "status": "pass" if passed else "fail",
                }
            )
            if not passed and first is None:
                first = stage_id
        out["candidates"][candidate] = {"status": "fail" if first else "pass", "first_failure": first, "stages": stages}
    return out
