"""What a runtime pair's comparison covered, and the coverage rule a gate needs.

The rule: every stage either side of a pair captured is compared on both sides. A stage is excused only when
the contract skips it by name (``skip: true``), when the side that lacks it declares it cannot produce it
(e.g. a runtime that does not decode has no ``text.generate.*``), or when it is the index of a token order
the lacking side holds no stage in (a raster-ordered engine needs no window index: the other side's is used).
Beyond that, a pair fails its coverage when
- a stage is missing on one side (a capture that stopped short, a tap file that holds only its inputs),
- a stage could not be judged: fewer than :data:`JUDGED_FLOOR` of its elements finite on both sides (the rest
  non-finite at the same places on both sides, e.g. a checkpoint of NaN weights: equal NaN are not agreement),
- fewer than :data:`JUDGED_FLOOR` of all the elements the pair compared could be judged,
- no model stage was compared at all: only data (processor inputs, index math), which no engine computes.

Each pair's record says how much was judged (``judged_fraction``: the compared elements finite on both sides, a
non-finite value the other side lacks counted as judged: it fails), and so does the verdict (``judged``).
"""

from __future__ import annotations

from driftscope.judge.rows import ComparisonRow
from driftscope.taps.stages import StagePlan, orders_of
from driftscope.taps.tapset import TapSet

#: Row statuses that compared both sides' values (the others: ``missing``, ``skipped``, ``not_judged``).
COMPARED = ("pass", "fail", "shape_mismatch", "layout_mismatch")
#: The least share of a stage's (and of a pair's) compared elements that must be judged, i.e. finite on both sides
#: (or non-finite on one side only, a failure): below it the stage is "not judged", which is not a pass.
JUDGED_FLOOR = 0.99


def judged_share(elements: int, nonfinite_both: int) -> float:
    """The share of ``elements`` that were judged when ``nonfinite_both`` of them are non-finite on both sides."""
    return (elements - nonfinite_both) / elements if elements else 1.0


def _sample(stages: list[str]) -> str:
    return stages[0] if len(stages) == 1 else f"{stages[0]}, ... ({len(stages)} stages)"


def unused_order_indexes(tapset: TapSet, plan: StagePlan) -> set[str]:
    """The index stages of the plan's token orders in which ``tapset`` holds no stage: it needs none of them."""
    used = {str(tapset.declaration(stage_id).get("token_order") or "") for stage_id in tapset.stage_ids()}
    out = set()
    for name, order in orders_of(plan).items():
        if name not in used:
            out |= {order.index, *([order.segments] if order.segments else [])}
    return out


def pair_coverage(
    rows: list[ComparisonRow], plan: StagePlan, absent: list[dict], reference: TapSet, candidate: TapSet
) -> dict:
    """The coverage record of one pair's ``rows``: counts, the stages behind each gap, and the reasons it fails
    the rule (empty when it holds). ``absent`` is the pair's ``not_compared`` groups (each says whether the
    lacking side declared the capability missing)."""
    declared = {stage for group in absent if group.get("declared") for stage in group["stages"]}
    needless = {"reference": unused_order_indexes(reference, plan), "candidate": unused_order_indexes(candidate, plan)}
    compared = [row.stage for row in rows if row.status in COMPARED]
    model = [stage for stage in compared if not (stage in plan and plan[stage].data)]
    missing = {"reference": [], "candidate": []}
    for row in rows:
        side = "reference" if row.note.endswith("reference") else "candidate"
        if row.status == "missing" and row.stage not in declared and row.stage not in needless[side]:
            missing[side].append(row.stage)
    not_judged = [row.stage for row in rows if row.status == "not_judged"]
    valued = [row for row in rows if row.status in (*COMPARED, "not_judged")]
    elements = sum(row.elements for row in valued)
    judged = judged_share(elements, sum(row.nonfinite_both for row in valued))
    problems = []
    for side, stages in missing.items():
        if stages:
            problems.append(
                f"the {side} did not capture {len(stages)} stage(s) the other side did ({_sample(stages)}): a gate "
                "needs coverage (capture them, select fewer with `stages` in the parameter file, or skip them by "
                "name in the contract)"
            )
    if not_judged:
        problems.append(
            f"{len(not_judged)} stage(s) could not be judged, non-finite on both sides ({_sample(not_judged)}) in "
            f"more than {1 - JUDGED_FLOOR:.0%} of their elements: what could not be judged is not a pass"
        )
    if judged < JUDGED_FLOOR:
        problems.append(
            f"only {judged:.2%} of the {elements} compared elements could be judged (the rest non-finite on both "
            f"sides), under the floor of {JUDGED_FLOOR:.0%}"
        )
    if compared and not model:
        problems.append(
            "no model stage was compared, only data (processor inputs and index math): a candidate that captured "
            "no model stage cannot pass"
        )
    return {
        "stages": len(rows),
        "compared": len(compared),
        "model_stages": len(model),
        "skipped": sum(row.status == "skipped" for row in rows),
        "declared_absent": len(declared),
        "missing": {side: stages for side, stages in missing.items() if stages},
        "not_judged": not_judged,
        "elements": elements,
        "judged_fraction": judged,
        "complete": not problems,
        "problems": problems,
    }
