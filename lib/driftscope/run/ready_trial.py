"""A failing run tries each pair's ready patch itself: the block (or the stage in no block) where the replay says
the error is introduced is captured again on the candidate with the family's ready patch applied and compared with
the reference (:mod:`driftscope.run.patch_trial`), within a time budget, so the first screen shows the patch's
before and after instead of leaving the re-capture to a cell of notebook 02.

``report.json["patch_trials"][pair]``: ``status`` ``tried`` (with ``patch``, ``block`` or ``stages``, ``closes``: no
stage fails with the patch, ``rows``: each stage's status and share of tolerance before and after, ``seconds``),
``not tried`` (``why``: over the budget) or ``could not try`` (``why``: the error).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from driftscope.errors import DriftscopeError
from driftscope.judge.rows import share_of_tolerance
from driftscope.run.patch_trial import Recapture, recapture_block, recapture_stages
from driftscope.run.report import Report

#: seconds of trials a run spends at most: a pair's trial is skipped when its candidate's own load and capture
#: (the run's timings) would take the run's trials past it
BUDGET_S = 60.0


def _used(row) -> float | None:
    return None if row is None or row.status not in ("pass", "fail") else share_of_tolerance(row)


def summary(trial: Recapture, directory=None) -> dict:
    """What the report keeps of a trial: per stage the run's status and share of tolerance, then the patched ones,
    and where the patched capture is (``tapset``, relative to ``directory``, the run's)."""
    rows = []
    for row in trial.rows:
        old = trial.before.get(row.stage)
        rows.append(
            {
                "stage": row.stage,
                "before": None if old is None else old.status,
                "before_used": _used(old),
                "after": row.status,
                "after_used": _used(row),
            }
        )
    where = {"block": trial.block} if trial.block is not None else {"stages": trial.stages}
    failing = [row.stage for row in trial.rows if row.failed]
    return {
        "status": "tried",
        "patch": trial.patch,
        **where,
        "closes": bool(trial.rows) and not failing,
        "failing_after": failing,
        "rows": rows,
        "seconds": round(trial.seconds, 2),
        **({"tapset": str(trial.tapset.tensor_path.relative_to(directory))} if trial.tapset and directory else {}),
    }


def _cost(report: Report, label: str) -> float:
    timings = next((r.get("timings") or {} for r in report.data.get("runtimes", []) if r.get("label") == label), {})
    return float(timings.get("load_s") or 0.0) + float(timings.get("capture_s") or 0.0)


def try_ready_patches(report: Report, log: Callable[[str], None], budget_s: float = BUDGET_S) -> dict:
    """Try each failing pair's first ready patch (its conclusion's ``ready_patches``) where the error is introduced;
    returns ``{pair: entry}`` (module docstring) for the pairs that have one."""
    trials: dict[str, dict] = {}
    verdicts = (report.data.get("verdict") or {}).get("per_candidate") or {}
    spent = 0.0
    for key in report.pair_keys():
        conclusion = report.conclusion(key)
        patches = conclusion.get("ready_patches") or []
        if not patches or verdicts.get(key) == "pass":
            continue
        stage = conclusion.get("stage") or conclusion.get("first_divergence")
        block = report.plan[stage].block if stage in report.plan else None
        cost = _cost(report, key)
        if spent + cost > budget_s:
            why = f"its capture takes {cost:.0f} s, past the run's {budget_s:.0f} s for trials"
            trials[key] = {"status": "not tried", "patch": patches[0], "why": why}
            continue
        where = f"block {block}" if block is not None else stage
        log(f"trying the ready patch {patches[0]} on {key}'s {where}")
        start = time.perf_counter()
        try:
            if block is not None:
                trial = recapture_block(report, key, block, patches[0], log=_quiet)
            else:
                trial = recapture_stages(report, key, [stage], patches[0], log=_quiet)
        except (DriftscopeError, KeyError, ValueError, RuntimeError) as err:
            trials[key] = {"status": "could not try", "patch": patches[0], "why": f"{type(err).__name__}: {err}"}
            log(f"  could not try it: {err}")
        else:
            trials[key] = summary(trial, report.directory)
            log(f"  {'closes it' if trials[key]['closes'] else 'still fails'} on {where} ({trial.seconds:.1f} s)")
        spent += time.perf_counter() - start
    return trials


def _quiet(message: str) -> None:
    """The trial's own progress stays out of the run's log (the run logs one line per trial)."""
