"""Narrowing: from "block 17 fails" to the operator that introduced it, in the same run.

When a runtime pair's first divergence is a stage whose pieces the run did not capture (a block whose substages
were not asked for, a head whose parts were left out), both sides capture those pieces for that pair only
(``recapture``: re-run from each side's stored inputs where the runtime can start mid-tower, else a targeted
forward) and the pair is compared again; this repeats down to the finest stage the family declares. The
candidate is then replayed on the reference's inputs over the narrowed plan (``drill_down``); if the first stage
it introduces error in still has pieces nobody captured, those are captured and replayed too, and so are those
of every other stage the replay labels introduced (a second defect in a later block), up to ``SITE_BUDGET``
more; the record says which were left (``not_narrowed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from driftscope.core.names import safe_name
from driftscope.judge.compare import compare_stage
from driftscope.judge.decode_site import decode_site
from driftscope.judge.rows import ComparisonRow, first_divergence
from driftscope.taps.stages import StagePlan, orders_of
from driftscope.taps.tapunion import TapUnion

from ..families import get_family
from .conclusion import conclude
from .drilldown import Drilldown, drill_down
from .recapture import RecaptureError, recapture

if TYPE_CHECKING:
    from driftscope.inputs.processor_output import ModelInputs
    from driftscope.judge.contract import Contract
    from driftscope.taps.tapset import TapSet

MAX_STEPS = 8  # a family's stage hierarchy is a few levels deep; this only stops a plan that refines forever
#: introduced stages narrowed beyond the first one's (each costs a capture of its pieces on both sides)
SITE_BUDGET = 4


@dataclass
class Side:
    """One side of the pair: its runtime, its run's TapSet, and the files narrowing added to it."""

    runtime: object
    run: TapSet
    extras: list[TapSet] = field(default_factory=list)

    @property
    def taps(self) -> TapUnion:
        return TapUnion(self.run, self.extras)


@dataclass
class PairResult:
    """What judging one reference-vs-candidate pair found: its rows over the narrowed plan, the narrowing
    record, the replay (if any) and its conclusion."""

    rows: list[ComparisonRow]
    plan: StagePlan
    reference: TapUnion
    candidate: TapUnion
    narrowing: dict
    drill: Drilldown | None = None
    conclusion: dict = field(default_factory=dict)


class ReferenceCache:
    """The reference's recaptured stages by target, shared by every candidate that narrows to the same stage."""

    def __init__(self) -> None:
        self.parts: dict[str, tuple[TapSet, str]] = {}


def _compare_more(rows, reference, candidate, plan: StagePlan, contract: Contract, added) -> list[ComparisonRow]:
    """``rows`` plus the ``added`` stages compared, in ``plan``'s order (positions renumbered)."""
    orders = orders_of(plan)
    new = [
        compare_stage(
            stage_id,
            reference,
            candidate,
            contract.tolerance(stage_id),
            0,
            orders,
            integer=plan[stage_id].integer,
            data=plan[stage_id].data,
        )
        for stage_id in added
    ]
    merged = {row.stage: row for row in [*rows, *new]}
    ordered = [merged[stage_id] for stage_id in plan.ordered(merged)]
    for position, row in enumerate(ordered):
        row.position = position
    return ordered


def _finer(stage_id: str | None, plan: StagePlan, full: StagePlan) -> list[str]:
    """The pieces of ``stage_id`` the family declares that ``plan`` has not captured."""
    if stage_id is None:
        return []
    return [piece for piece in get_family(full.family).substages_of(stage_id, full) if piece not in plan]


class Narrower:
    """Narrows one pair: captures the pieces of a target stage on both sides and compares them."""

    def __init__(self, reference: Side, candidate: Side, inputs, full: StagePlan, contract, out: Path, cache, log):
        self.reference, self.candidate = reference, candidate
        self.inputs, self.full, self.contract, self.out = inputs, full, contract, out
        self.cache, self.log = cache, log
        self.steps: list[dict] = []
        self.budget = SITE_BUDGET  # narrowings left for introduced stages past the first one's
        self.not_narrowed: list[str] = []

    def narrow(self, target: str, stages: list[str], plan: StagePlan, rows: list) -> tuple[StagePlan, list] | None:
        """Capture ``stages`` (the pieces of ``target``) on both sides; the pair's plan and rows with them, or
        None when a side cannot capture them (the step says why)."""
        start = time.perf_counter()
        step: dict = {"target": target, "stages": stages}
        try:
            if target not in self.cache.parts:
                self.cache.parts[target] = self._recapture(self.reference, target, stages)
            reference_part, step["reference"] = self.cache.parts[target]
            candidate_part, step["candidate"] = self._recapture(self.candidate, target, stages)
        except RecaptureError as err:
            step["error"] = f"{err.problem} ({err.fix})"
            self.steps.append(step)
            self.log(f"cannot narrow {target}: {err.problem}")
            return None
        self.reference.extras.append(reference_part)
        self.candidate.extras.append(candidate_part)
        plan = plan.with_stages(stages, self.full)
        rows = _compare_more(rows, self.reference.taps, self.candidate.taps, plan, self.contract, stages)
        step["seconds"] = time.perf_counter() - start
        self.steps.append(step)
        self.log(f"narrowed {target}: {len(stages)} stages captured on both sides in {step['seconds']:.1f}s")
        return plan, rows

    def _recapture(self, side: Side, target: str, stages: list[str]) -> tuple[TapSet, str]:
        base = self.out / "taps" / f"narrow-{safe_name(side.run.label)}-{safe_name(target)}"
        return recapture(side.runtime, side.run, self.inputs, self.full, stages, base)

    def until_finest(self, plan: StagePlan, rows: list) -> tuple[StagePlan, list]:
        """Narrow the first divergence while it has pieces nobody captured."""
        for _ in range(MAX_STEPS):
            first = first_divergence(rows)
            stages = _finer(first.stage if first else None, plan, self.full)
            if not stages:
                break
            narrowed = self.narrow(first.stage, stages, plan, rows)
            if narrowed is None:
                break
            plan, rows = narrowed
        return plan, rows

    def record(self, out: Path) -> dict:
        parts = {
            name: [str(part.tensor_path.relative_to(out)) for part in side.extras]
            for name, side in (("reference", self.reference), ("candidate", self.candidate))
        }
        added = [stage for step in self.steps if "error" not in step for stage in step["stages"]]
        return {
            "added": added,
            "steps": self.steps,
            "tapsets": parts,
            "site_budget": SITE_BUDGET,
            "not_narrowed": self.not_narrowed,
        }

    def targets(self, drill: Drilldown, plan: StagePlan) -> list[str]:
        """The introduced stages whose pieces nobody captured yet, in execution order: the first one always, the
        others while the budget lasts (the rest are recorded as not narrowed)."""
        tried = {step["target"] for step in self.steps}
        introduced = [label["stage"] for label in drill.labels if label["label"] == "introduced"]
        found = [stage for stage in introduced if stage not in tried and _finer(stage, plan, self.full)]
        chosen = []
        for stage in found:
            if stage == drill.first_introduced:
                chosen.append(stage)
            elif self.budget > 0:
                self.budget -= 1
                chosen.append(stage)
            elif stage not in self.not_narrowed:
                self.not_narrowed.append(stage)
        return chosen


def judge_pair(
    reference: Side,
    candidate: Side,
    inputs: ModelInputs,
    plan: StagePlan,
    full: StagePlan,
    contract: Contract,
    out: Path,
    label: str,
    narrow: bool = True,
    replay: bool = True,
    cache: ReferenceCache | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> PairResult:
    """Compare one pair, narrow it (``narrow``), replay the candidate on the reference's inputs (``replay``, where
    it can) and conclude. ``plan``: the run's plan; ``full``: every stage the family declares."""
    from driftscope.judge.compare import compare_tapsets

    narrower = Narrower(reference, candidate, inputs, full, contract, out, cache or ReferenceCache(), log)
    rows = compare_tapsets(reference.run, candidate.run, contract, plan)
    if narrow:
        plan, rows = narrower.until_finest(plan, rows)
    drill = None
    if replay and getattr(candidate.runtime, "can_replay", False):
        drill = _drill(reference, candidate, rows, contract, plan, out, label, log)
        for _ in range(MAX_STEPS if narrow else 0):  # each stage introducing error may itself have pieces
            narrowed = False
            for target in narrower.targets(drill, plan):
                step = narrower.narrow(target, _finer(target, plan, full), plan, rows)
                if step is not None:
                    (plan, rows), narrowed = step, True
            if not narrowed:
                break
            drill = _drill(reference, candidate, rows, contract, plan, out, label, log)
    for row in rows:
        row.pair = label
    return PairResult(
        rows,
        plan,
        reference.taps,
        candidate.taps,
        narrower.record(out),
        drill,
        conclude(drill, rows, plan, decode_site(rows, reference.run, candidate.run, contract, plan)),
    )


def _drill(reference: Side, candidate: Side, rows, contract, plan, out: Path, label: str, log) -> Drilldown:
    log(f"replay {label} on {reference.run.label}'s stage inputs")
    drill = drill_down(
        reference.taps,
        candidate.runtime,
        rows,
        contract,
        plan,
        out / "taps" / f"replay-{safe_name(label)}",
        label,
        progress=lambda message: log(f"  {label}: {message}"),
    )
    if drill.first_introduced:
        log(f"  {label}: first introduced error at {drill.first_introduced}")
    return drill
