"""Introduced, inherited or amplified: each stage's op-local error next to its accumulated error.

The op-local error of a stage is the candidate's operator fed the reference's own stage inputs
(a replay), compared with the reference's output. The accumulated error is the normal run's.
A stage is *amplified* when its accumulated error is ``AMPLIFY`` times both the error it received (its
inputs' accumulated error) and its own op-local error: neither its own rounding nor the error passed on
explains it. A stage fed exact inputs (data) has no incoming error to amplify.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.judge.compare import ComparisonRow, compare_tapsets
from driftscope.judge.contract import Contract
from driftscope.judge.verdict import DRIFT_FLOOR  # below it, error is float32 round-off, not drift
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet, TapWriter

from ..families import get_family

AMPLIFY = 10.0  # an operator that multiplies the incoming relative error by this much is "amplified"


@dataclass
class Drilldown:
    """Op-local rows and per-stage labels of one runtime pair."""

    pair: str
    reference: str
    candidate: str
    rows: list[ComparisonRow]
    labels: list[dict] = field(default_factory=list)
    tapset: str = ""

    @property
    def first_introduced(self) -> str | None:
        return next((label["stage"] for label in self.labels if label["label"] == "introduced"), None)

    def to_dict(self) -> dict:
        return {
            "pair": self.pair,
            "reference": self.reference,
            "candidate": self.candidate,
            "tapset": self.tapset,
            "first_introduced": self.first_introduced,
            "rows": [row.to_dict() for row in self.rows],
            "labels": self.labels,
        }


def replay_tapset(reference: TapSet, runtime, plan: StagePlan, out_base: Path, progress=None) -> TapSet:
    """Replay every replayable stage of ``plan`` whose inputs the reference captured; stream to a TapSet.

    The family says what each replay reads and builds the side inputs every replay needs (its context,
    whose ``stage(reference, name)`` gives a reference stage, or a view of one, ``stage@view``)."""
    family = get_family(plan.family)
    ctx = family.replay_context(reference, plan)
    meta = {
        "runtime": runtime.name,
        "label": f"{runtime.label} (replay)",
        "policy": runtime.policy.to_dict(),
        "replay_of": reference.label,
    }
    start = time.perf_counter()
    with TapWriter(out_base, meta) as writer:
        for stage in plan:
            needs = family.replay_inputs(stage.id, plan)
            if not needs or stage.id not in reference:
                continue
            values = [ctx.stage(reference, name) for name in needs]
            if any(value is None for value in values):
                continue
            writer.add(stage, runtime.replay(stage.id, values, ctx))
        writer.meta["timings"] = {"replay_s": time.perf_counter() - start}
    if progress:
        progress(f"replayed {len(writer.stages)} stages on {reference.label}'s inputs")
    return TapSet(writer.tensor_path)


def _incoming(stage_id: str, plan: StagePlan, accumulated: dict[str, ComparisonRow]) -> float | None:
    """The largest accumulated relative error among the stages a replay of ``stage_id`` reads."""
    needs = get_family(plan.family).replay_inputs(stage_id, plan) or ()
    names = [name.split("@")[0] for name in needs]  # a view of a stage carries that stage's error
    values = [accumulated[name].relative_rms for name in names if name in accumulated]
    return max(values) if values else None


def label_stages(op_local: list[ComparisonRow], accumulated: list[ComparisonRow], plan: StagePlan) -> list[dict]:
    """introduced / amplified / inherited / clean for every replayed stage, with the amplification factor."""
    by_stage = {row.stage: row for row in accumulated}
    labels = []
    for row in op_local:
        acc = by_stage.get(row.stage)
        if acc is None:
            continue
        incoming = _incoming(row.stage, plan, by_stage)
        factor = acc.relative_rms / incoming if incoming else None
        own = row.relative_rms if math.isfinite(row.relative_rms) else math.inf
        if row.failed:
            label = "introduced"
        elif factor is not None and factor >= AMPLIFY and acc.relative_rms > max(DRIFT_FLOOR, AMPLIFY * own):
            label = "amplified"
        elif acc.failed:
            label = "inherited"
        else:
            label = "clean"
        labels.append(
            {
                "stage": row.stage,
                "label": label,
                "op_local_relative_rms": row.relative_rms,
                "op_local_max_abs": row.max_abs,
                "op_local_failures": row.failures,
                "accumulated_relative_rms": acc.relative_rms,
                "accumulated_max_abs": acc.max_abs,
                "accumulated_failures": acc.failures,
                "incoming_relative_rms": incoming,
                "amplification": None if factor is None or math.isinf(factor) else factor,
            }
        )
    return labels


def judge_replay(
    reference: TapSet,
    replayed: TapSet,
    accumulated: list[ComparisonRow],
    contract: Contract,
    plan: StagePlan,
    pair: str,
    candidate: str,
) -> Drilldown:
    """Compare a replay TapSet with the reference and label each stage."""
    replayed_ids = set(replayed.stage_ids())
    rows = [row for row in compare_tapsets(reference, replayed, contract, plan) if row.stage in replayed_ids]
    for row in rows:
        row.pair = pair
        row.candidate = f"{candidate} (replay)"
    drill = Drilldown(pair, reference.label, candidate, rows, tapset=str(replayed.tensor_path))
    drill.labels = label_stages(rows, accumulated, plan)
    return drill


def drill_down(
    reference: TapSet,
    runtime,
    accumulated: list[ComparisonRow],
    contract: Contract,
    plan: StagePlan,
    out_base: Path,
    pair: str,
    progress=None,
) -> Drilldown:
    """Replay ``runtime`` on the reference's inputs and label every stage of the pair."""
    replayed = replay_tapset(reference, runtime, plan, out_base, progress)
    return judge_replay(reference, replayed, accumulated, contract, plan, pair, runtime.label)
