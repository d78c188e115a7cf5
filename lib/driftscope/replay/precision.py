"""Precision search: the fewest operators a failing half-precision candidate must compute in float32 to pass.

Polygraphy's ``debug precision`` for any runtime the family can widen operator by operator. Each probe keeps a set
of operators in float32 and captures the candidate again from the first block it changes on (the run's own
capture holds everything before it, and the reference's taps are the run's), then judges the run's vision stages
under the run's contract. The search:

1. the baseline (the run's rows, no probe) and every operator in float32: when even that fails, no set of float32
   operators closes the failure and the search stops after one probe. It says which kind of failure that is: where
   the error left is within a few units of the policy's round-off (:data:`ROUNDING_UNITS`), it is the policy's own
   half-precision storage (weights and the values between operators, which stay half precision whatever operator
   computes in float32; the worst element then moves by chance, so the probe can read worse than the baseline):
   a contract stricter than that storage holds; beyond it, not a precision defect;
2. each operator kind alone across the model (one norm of every block, a tower projection, ...): what each buys;
3. for the kinds kept, bisection over block ranges: the first block they are needed from, then the last one.

At most ``2 + kinds + 2 * ceil(log2(blocks))`` probes, when one kind alone closes it; otherwise kinds are added
one at a time until the set passes, then each dropped again if the set passes without it (at most ``2 * kinds``
probes more). The bisection assumes that widening more blocks never hurts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from driftscope.judge.compare import compare_stage
from driftscope.judge.rows import ComparisonRow, share_of_tolerance
from driftscope.model.mixed import compress
from driftscope.taps.stages import StagePlan, orders_of
from driftscope.taps.tapunion import TapUnion

from .recapture import rerun_from_stored, targeted_forward

if TYPE_CHECKING:
    from driftscope.judge.contract import Contract
    from driftscope.taps.tapset import TapSet

#: unit round-off (half a unit in the last place, relative) of each activation dtype
ROUNDING = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
#: the error left with every operator in float32, in units of the policy's round-off, up to which it is the policy's
#: own storage (weights and values between operators rounded at every one of a few dozen steps), not a defect
ROUNDING_UNITS = 8


@dataclass
class Probe:
    """One probe: the operators it kept in float32 (patterns), whether every judged stage passed, the worst share
    of its tolerance any stage used, where, how many stages it captured again, and its seconds."""

    index: int
    phase: str
    f32: list[str]
    operators: int
    passed: bool
    tolerance_used: float
    worst_stage: str | None
    first_failure: str | None
    recaptured: int
    seconds: float
    #: the largest relative RMS error of a failing stage (None when none fails)
    failing_relative_rms: float | None = None


@dataclass
class Candidate:
    """What a probe needs of the candidate: its runtime (loaded with the run's own options and patch), its run's
    TapSet, and how it widens operators: in place (``widen(ids) -> undo``) or a fresh runtime per probe."""

    runtime: object
    own: TapSet
    widen: Callable[[list[str]], Callable[[], None]] | None = None
    fresh: Callable[[list[str]], object] | None = None
    inputs: object = None  # the run's processor output (a fresh runtime's forward)
    way: str = ""


@dataclass
class SearchResult:
    closes: bool
    answer: list[str] | None
    operators: int
    message: str
    kinds: list[dict]
    probes: list[Probe] = field(default_factory=list)
    bound: int = 0
    seconds: float = 0.0
    #: why nothing closes it: "storage" (the policy's own half-precision storage, no operator's), "defect" (not a
    #: precision defect); None when a set closes it
    limit: str | None = None

    def to_dict(self) -> dict:
        data = asdict(self)
        data["probes"] = [asdict(probe) for probe in self.probes]
        return data


class PrecisionSearch:
    """Probes of one candidate against the run's reference taps, over the run's judged vision stages."""

    def __init__(
        self,
        candidate: Candidate,
        reference: TapSet,
        plan: StagePlan,
        judged: list[str],
        run_rows: dict[str, ComparisonRow],
        contract: Contract,
        out: Path,
        log: Callable[[str], None] = lambda message: None,
        fixed: Iterable[str] = (),
    ):
        """``fixed``: judged stages no operator changes (no function of earlier stages, e.g. rotary tables): a
        probe keeps the run's rows for them."""
        self.candidate, self.reference, self.plan, self.contract = candidate, reference, plan, contract
        self.fixed = set(fixed)
        self.judged = plan.ordered(judged)
        self.run_rows, self.out, self.log = run_rows, out, log
        self.position = {stage.id: index for index, stage in enumerate(plan)}
        self.orders = orders_of(plan)
        self.probes: list[Probe] = []
        self._seen: dict[frozenset, Probe] = {}

    # -- one probe ---------------------------------------------------------------------------------------------

    def _start(self, stage_ids: list[str]) -> int:
        """The plan position from which a widened operator changes what the candidate computes: its stage's own
        (a block's substage comes before that block's output), else the judged stage holding it (an operator that
        is no stage, e.g. a fused projection: its block's output), else the start."""
        starts = []
        for stage_id in stage_ids:
            if stage_id in self.position:
                starts.append(self.position[stage_id])
                continue
            holder = next((s for s in self.judged if stage_id.startswith(s + ".")), None)
            starts.append(self.position[holder] if holder else 0)
        return min(starts)

    def probe(self, stage_ids: list[str], phase: str) -> Probe:
        key = frozenset(stage_ids)
        if key in self._seen:
            return self._seen[key]
        start = time.perf_counter()
        index = len(self.probes)
        if not stage_ids:  # the run's own rows
            rows, recaptured = [self.run_rows[s] for s in self.judged if s in self.run_rows], 0
        else:
            rows, recaptured = self._rows(list(stage_ids), self.out / f"probe-{index}")
        judged = [row for row in rows if row.status in ("pass", "fail") and not row.integer]
        worst = max(judged, key=share_of_tolerance, default=None)
        failing = next((row.stage for row in rows if row.status not in ("pass", "skipped")), None)
        errors = [row.relative_rms for row in rows if row.status not in ("pass", "skipped") and not row.integer]
        finite = [float(e) for e in errors if e is not None and math.isfinite(e)]
        worst_relative = (max(finite) if len(finite) == len(errors) else math.inf) if errors else None
        probe = Probe(
            index,
            phase,
            compress(stage_ids),
            len(stage_ids),
            failing is None,
            share_of_tolerance(worst) if worst else 0.0,
            worst.stage if worst else None,
            failing,
            recaptured,
            time.perf_counter() - start,
            worst_relative,
        )
        self.probes.append(probe)
        self._seen[key] = probe
        verdict = "passes" if probe.passed else f"fails at {failing}"
        self.log(
            f"  probe {index} ({phase}): {', '.join(probe.f32) or 'none'} in float32: {verdict}, "
            f"tolerance used {probe.tolerance_used:.3g} ({recaptured} stages in {probe.seconds:.1f}s)"
        )
        return probe

    def _rows(self, stage_ids: list[str], out_base: Path) -> tuple[list[ComparisonRow], int]:
        begin = self._start(stage_ids)
        again = [s for s in self.judged if self.position[s] >= begin and s not in self.fixed]
        before = [
            self.run_rows[s]
            for s in self.judged
            if (self.position[s] < begin or s in self.fixed) and s in self.run_rows
        ]
        candidate = self.candidate
        if candidate.widen is not None:
            undo = candidate.widen(stage_ids)
            try:
                tapset = rerun_from_stored(candidate.runtime, candidate.own, self.plan, again, out_base)
            finally:
                undo()
        else:
            runtime = candidate.fresh(stage_ids)
            subset = StagePlan(self.plan.family, [self.plan[s] for s in self.judged], self.plan.depth, self.plan.meta)
            try:
                tapset = targeted_forward(runtime, candidate.inputs, subset, list(self.judged), out_base)
            finally:
                runtime.release()
            again, before = list(self.judged), []
        tapset = TapUnion(tapset, [candidate.own])  # the probe's stages first; the run's index math and the rest
        rows = [
            compare_stage(
                s,
                self.reference,
                tapset,
                self.contract.tolerance(s),
                self.position[s],
                self.orders,
                integer=self.plan[s].integer,
                data=self.plan[s].data,
            )
            for s in again
        ]
        return before + rows, len(again)

    # -- the search --------------------------------------------------------------------------------------------

    def run(self, operators: list[str]) -> SearchResult:
        """Search over ``operators`` (stage-id templates, ``{b}`` a block: ``Family.precision_operators``)."""
        start = time.perf_counter()
        depth = self.plan.depth
        blockwise = [op for op in operators if "{b}" in op]
        bound = 2 + len(operators) + (2 * math.ceil(math.log2(depth)) if blockwise and depth > 1 else 0)

        def ids(kinds: list[str], lo: int = 0, hi: int = depth - 1) -> list[str]:
            return [op.format(b=b) for op in kinds if "{b}" in op for b in range(lo, hi + 1)] + [
                op for op in kinds if "{b}" not in op
            ]

        def result(closes, answer, message, kinds, limit=None) -> SearchResult:
            n = len(ids(answer[0], *answer[1])) if answer else 0
            patterns = compress(ids(answer[0], *answer[1])) if answer else None
            elapsed = time.perf_counter() - start
            return SearchResult(closes, patterns, n, message, kinds, self.probes, bound, elapsed, limit)

        baseline = self.probe([], "baseline")
        if baseline.passed:
            return result(True, ([], (0, depth - 1)), "the candidate passes as it is: nothing needs float32", [])
        everything = self.probe(ids(operators), "all")
        if not everything.passed:
            message, limit = self._unclosed(baseline, everything)
            return result(False, None, message, [], limit)
        kinds = [{"kind": op, **self._alone(self.probe(ids([op]), "kind"), baseline)} for op in operators]
        chosen = self._choose(operators, kinds, ids)
        lo, hi = 0, depth - 1
        if any(op in blockwise for op in chosen):
            lo, hi = self._bisect(chosen, ids, depth)
        final = self._seen[frozenset(ids(chosen, lo, hi))]
        message = (
            f"{', '.join(compress(ids(chosen, lo, hi)))} in float32 ({final.operators} operators), everything else "
            f"as the policy has it: tolerance used {baseline.tolerance_used:.3g} -> {final.tolerance_used:.3g}"
        )
        return result(True, (chosen, (lo, hi)), message, kinds)

    def _unclosed(self, baseline: Probe, everything: Probe) -> tuple[str, str]:
        """Why every operator in float32 still fails: (the message, "storage" or "defect")."""
        said = (
            f"no set of float32 operators closes it: with every operator the family can widen in float32 "
            f"({everything.operators}) it still fails at {everything.first_failure} (tolerance used "
            f"{baseline.tolerance_used:.3g} -> {everything.tolerance_used:.3g})"
        )
        dtype = getattr(getattr(self.candidate.runtime, "policy", None), "activations", "float32")
        unit = ROUNDING.get(str(dtype))
        error = everything.failing_relative_rms
        if unit is None or error is None or error > ROUNDING_UNITS * unit:
            return f"{said}: not a precision defect", "defect"
        return (
            f"{said}, with a relative error of {error:.2g} ({error / unit:.1f} units of {dtype} round-off): what "
            f"is left is the policy's own {dtype} storage (the weights and the values between operators, which "
            "stay in it whatever operator computes in float32; the worst element moves by chance). It is no defect "
            f"of an operator: the contract asks more than {dtype} holds. Judge this candidate under a contract for "
            f"{dtype} work (e.g. parameters/contracts/default.yaml), or run it in float32",
            "storage",
        )

    @staticmethod
    def _alone(probe: Probe, baseline: Probe) -> dict:
        return {
            "passed": probe.passed,
            "tolerance_used": probe.tolerance_used,
            "probe": probe.index,
            "first_failure": probe.first_failure,
            "before": baseline.tolerance_used,
        }

    def _choose(self, operators: list[str], kinds: list[dict], ids) -> list[str]:
        """One kind that closes it alone (the fewest operators, then the least tolerance used), else kinds added
        by what each buys alone until the probe passes (a kind whose probe changed nothing added last: it
        changes stages the worst one does not reach, if any), then each added kind but the last dropped again
        when the set passes without it (one probe each): no kind of the answer can go."""
        alone = [entry for entry in kinds if entry["passed"]]
        if alone:
            best = min(alone, key=lambda e: (len(ids([e["kind"]])), e["tolerance_used"]))
            return [best["kind"]]
        unchanged = lambda e: e["tolerance_used"] == e["before"]  # noqa: E731
        chosen: list[str] = []
        for entry in sorted(kinds, key=lambda e: (unchanged(e), e["tolerance_used"])):
            chosen.append(entry["kind"])
            if self.probe(ids(chosen), "kinds").passed:
                break
        else:
            chosen = list(operators)  # the kinds' union is every operator, which passes
        for kind in chosen[:-1]:
            trial = [op for op in chosen if op != kind]
            if self.probe(ids(trial), "drop kind").passed:
                chosen = trial
        return [op for op in operators if op in chosen]

    def _bisect(self, chosen: list[str], ids, depth: int) -> tuple[int, int]:
        """The latest first block, then the earliest last block, the chosen kinds are needed over."""
        good, bad = 0, depth  # widening blocks good..depth-1 passes; bad..: not known to
        while bad - good > 1:
            mid = (good + bad) // 2
            if self.probe(ids(chosen, mid, depth - 1), "first block").passed:
                good = mid
            else:
                bad = mid
        lo = good
        good, bad = depth - 1, lo - 1  # widening lo..good passes
        while good - bad > 1:
            mid = (good + bad) // 2
            if self.probe(ids(chosen, lo, mid), "last block").passed:
                good = mid
            else:
                bad = mid
        return lo, good
