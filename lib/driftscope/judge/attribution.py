"""Closer-to attribution: which of several references a candidate's taps are closer to, stage by stage.

With ``candidate: iree:q4-dequant`` and ``references: [mlx:q4, mlx:q4-dequant]``, a candidate closer to
the dequantized reference at almost every block says its remaining drift from ``mlx:q4`` is the fused
kernel's, not its own. The error measure is the relative RMS (``rms(candidate - reference) /
rms(reference)``, as in the comparison rows); the ratio is the farther reference's error over the
nearer one's. Everything here is a pure function of stored taps or of comparison rows.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from driftscope.core.numeric import relative_rms
from driftscope.judge.verdict import DRIFT_FLOOR

#: relative RMS below which two references are equally near: both within round-off of the candidate cannot say
#: which one it computes like (the drift floor of the verdict)
ROUND_OFF = DRIFT_FLOOR

#: stage ids counted by the verdict by default: whole blocks (``vision.block.7``)
BLOCK_STAGE = re.compile(r"(^|\.)block\.\d+$")


@dataclass(frozen=True)
class CloserRow:
    """One stage: the candidate's relative RMS error to each reference."""

    stage: str
    errors: dict[str, float]

    @property
    def ranked(self) -> list[tuple[str, float]]:
        return sorted(self.errors.items(), key=lambda item: item[1])

    @property
    def closer(self) -> str | None:
        """The nearest reference; None when the nearest two are equally near, or both within round-off."""
        ranked = self.ranked
        if len(ranked) >= 2 and (ranked[0][1] >= ranked[1][1] or ranked[1][1] <= ROUND_OFF):
            return None
        return ranked[0][0]

    @property
    def within_round_off(self) -> bool:
        """Every reference is within round-off of the candidate here."""
        return all(error <= ROUND_OFF for error in self.errors.values())

    @property
    def ratio(self) -> float:
        """Second-nearest error over the nearest (1 on a tie, inf when the nearest is exact)."""
        ranked = self.ranked
        if len(ranked) < 2 or ranked[0][1] == ranked[1][1]:
            return 1.0
        return ranked[1][1] / ranked[0][1] if ranked[0][1] > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "errors": dict(self.errors), "closer": self.closer, "ratio": self.ratio}


def closer_rows(errors: Mapping[str, Mapping[str, float]], stages: Sequence[str] | None = None) -> list[CloserRow]:
    """Rows from ``{reference: {stage: relative RMS}}``; stages every reference has, in ``stages``' order."""
    labels = list(errors)
    if len(labels) < 2:
        raise ValueError("closer-to attribution needs at least two references")
    common = [s for s in (stages or errors[labels[0]]) if all(s in errors[label] for label in labels)]
    return [CloserRow(stage, {label: float(errors[label][stage]) for label in labels}) for stage in common]


def closer_to_arrays(
    candidate: Mapping[str, np.ndarray],
    references: Mapping[str, Mapping[str, np.ndarray]],
    stages: Sequence[str] | None = None,
) -> list[CloserRow]:
    """Rows from in-memory taps: ``candidate`` and each reference as ``{stage: array}``."""
    errors = {
        label: {stage: relative_rms(candidate[stage], taps[stage]) for stage in candidate if stage in taps}
        for label, taps in references.items()
    }
    return closer_rows(errors, stages or list(candidate))


def closer_to_comparisons(rows_by_reference: Mapping[str, Sequence[Any]]) -> list[CloserRow]:
    """Rows from comparison rows already made (``ComparisonRow``: candidate against each reference)."""
    usable = ("pass", "fail")
    errors = {
        label: {row.stage: row.relative_rms for row in rows if row.status in usable and not row.integer}
        for label, rows in rows_by_reference.items()
    }
    order = [row.stage for row in next(iter(rows_by_reference.values()))]
    return closer_rows(errors, order)


def closer_to_tapsets(
    candidate: Any, references: Sequence[Any], stages: Sequence[str] | None = None
) -> list[CloserRow]:
    """Rows from TapSets on disk, each stage compared as the report compares it (window order restored)."""
    from driftscope.judge.compare import compare_stage
    from driftscope.judge.contract import Tolerance

    stage_ids = list(stages or candidate.stage_ids())
    rows = {
        reference.label: [compare_stage(s, reference, candidate, Tolerance(), i) for i, s in enumerate(stage_ids)]
        for reference in references
    }
    return closer_to_comparisons(rows)


def is_dequantized(label: str) -> bool:
    """Whether a runtime label names a host-dequantized execution (``mlx:q4-dequant-f16``)."""
    return "dequant" in label.rpartition(":")[2]


def explain_quantized(candidate: str, winner: str, others: Sequence[str]) -> str:
    """Why a candidate sits nearer one of a fused and a dequantized reference ('' when neither shape fits)."""
    runtime = candidate.partition(":")[0]
    if is_dequantized(winner) and not any(is_dequantized(o) for o in others):
        possessive = f"{runtime}'" if runtime.endswith("s") else f"{runtime}'s"
        own = "the compiled graph" if runtime in ("iree", "jax") else f"{possessive} own arithmetic"
        return f"the remaining drift is the fused kernel's accumulation, not {own}"
    if not is_dequantized(winner) and all(is_dequantized(o) for o in others):
        return "the candidate shares the fused kernel's error (it quantizes or accumulates like the fused path)"
    return ""


@dataclass(frozen=True)
class Attribution:
    """The verdict over the counted stages (blocks by default) and every row behind it."""

    candidate: str
    references: tuple[str, ...]
    rows: list[CloserRow]
    counted: list[CloserRow] = field(default_factory=list)
    winner: str | None = None
    wins: int = 0
    verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "references": list(self.references),
            "winner": self.winner,
            "wins": self.wins,
            "counted": len(self.counted),
            "verdict": self.verdict,
            "rows": [row.to_dict() for row in self.rows],
        }


def attribute(
    candidate: str,
    rows: list[CloserRow],
    counted: Callable[[str], bool] = lambda stage: bool(BLOCK_STAGE.search(stage)),
    noun: str = "blocks",
    explain: Callable[[str, str, Sequence[str]], str] = explain_quantized,
) -> Attribution:
    """The :class:`Attribution` of ``rows``: the reference nearest at most counted stages, and the verdict line."""
    references = tuple(rows[0].errors) if rows else ()
    chosen = [row for row in rows if counted(row.stage)]
    total = len(chosen)
    wins = {label: sum(row.closer == label for row in chosen) for label in references}
    ranked = sorted(wins.items(), key=lambda item: -item[1])
    if not total:
        return Attribution(candidate, references, rows, chosen, verdict=f"{candidate}: no {noun} to attribute")
    if ranked[0][1] == 0 or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        ties = sum(row.closer is None for row in chosen)
        level = sum(row.within_round_off for row in chosen)
        verdict = (
            f"{candidate} is no closer to one of {', '.join(references)} than to the others "
            f"({', '.join(f'{label} {count}' for label, count in ranked)}, tied {ties} of {total} {noun}"
            + (
                f"; at {level} every reference is within round-off of it, relative RMS <= {ROUND_OFF:g})"
                if level
                else ")"
            )
        )
        return Attribution(candidate, references, rows, chosen, verdict=verdict)
    winner, count = ranked[0]
    others = [label for label in references if label != winner]
    ratio = statistics.median(row.ratio for row in chosen if row.closer == winner)
    verdict = f"{candidate} is closer to {winner} than to {' or '.join(others)} at {count}/{total} {noun}"
    verdict += f" (median ratio {ratio:.3g}x)"
    reason = explain(candidate, winner, others)
    return Attribution(candidate, references, rows, chosen, winner, count, verdict + (f": {reason}" if reason else ""))


def attribution_report(
    tapsets: Mapping[str, Any],
    section: Mapping[str, Any],
    contract: Any,
    plan: Any,
    compared: Mapping[tuple[str, str], Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """The report's ``attribution`` section: the candidate against each reference, on the rows the run made
    (``compared``, by (reference, candidate) label) or compares now; every stage's errors and the verdict."""
    from driftscope.judge.compare import compare_tapsets

    candidate, references = section["candidate"], list(section["references"])
    missing = [label for label in [candidate, *references] if label not in tapsets]
    if missing:
        verdict = f"{candidate}: no attribution, {', '.join(missing)} did not run"
        return {"candidate": candidate, "references": references, "winner": None, "verdict": verdict, "rows": []}
    rows = {
        label: (compared or {}).get((label, candidate))
        or compare_tapsets(tapsets[label], tapsets[candidate], contract, plan)
        for label in references
    }
    return attribute(candidate, closer_to_comparisons(rows)).to_dict()
