"""Capture stages a run did not tap, after the run, for one runtime: what narrowing adds.

Two ways, the first where the runtime can start mid-tower:

- **re-run from the stored inputs**: the runtime's own operators (its replay operators) fed its own captured
  stages, each stage's output feeding the next (a block's substages from that block's stored input). No forward
  pass is repeated; the result is what the runtime's forward computes there, up to the round-off of running the
  operators one at a time.
- **targeted forward**: the runtime's capture once more, tapping only those stages (any runtime that captures).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet, TapWriter

from ..errors import DriftscopeError
from ..families import get_family

if TYPE_CHECKING:
    from driftscope.inputs.processor_output import ModelInputs

RERUN = "re-run from its stored inputs"
FORWARD = "targeted forward"


class RecaptureError(DriftscopeError):
    """The stages could not be captured after the run (a runtime that neither replays nor captures again)."""


def how(runtime) -> str | None:
    """How ``runtime`` captures stages after its run (None: it cannot, e.g. taps read from a file)."""
    if runtime.external:
        return None
    return RERUN if runtime.can_replay else FORWARD


def rerun_from_stored(runtime, own: TapSet, plan: StagePlan, stages: list[str], out_base: Path) -> TapSet:
    """``stages`` (in ``plan``'s order) by ``runtime``'s operators on its own captured stages (``own``), each
    output feeding the stages after it. ``plan``: the full plan, which declares what each stage reads."""
    family = get_family(plan.family)
    ctx = family.replay_context(own, plan)
    values: dict[str, np.ndarray] = {}
    start = time.perf_counter()
    with TapWriter(out_base, _meta(own, RERUN)) as writer:
        for stage_id in plan.ordered(stages):
            needs = family.replay_inputs(stage_id, plan)
            if not needs:
                raise RecaptureError(
                    f"{stage_id} is not a function of earlier stages, so {runtime.label} cannot re-run it",
                    "capture it in the run (stages: include) instead",
                )
            inputs = [values[name] if name in values else ctx.stage(own, name) for name in needs]
            missing = [name for name, value in zip(needs, inputs, strict=True) if value is None]
            if missing:
                raise RecaptureError(
                    f"{runtime.label} cannot re-run {stage_id}: its run did not capture {missing}",
                    "capture those stages in the run (stages: include)",
                )
            values[stage_id] = runtime.replay(stage_id, inputs, ctx)
            writer.add(plan[stage_id], values[stage_id])
        writer.meta["timings"] = {"recapture_s": time.perf_counter() - start}
    return TapSet(writer.tensor_path)


def targeted_forward(runtime, inputs: ModelInputs, plan: StagePlan, stages: list[str], out_base: Path) -> TapSet:
    """``stages`` from one more forward of ``runtime`` that taps only them."""
    subset = StagePlan(plan.family, [plan[stage_id] for stage_id in plan.ordered(stages)], plan.depth, plan.meta)
    tapset = runtime.capture(inputs, subset, out_base)
    missing = [stage_id for stage_id in stages if stage_id not in tapset]
    if missing:
        raise RecaptureError(
            f"a forward of {runtime.label} tapping {len(stages)} stages did not capture {missing}",
            "check that the family's taps for this runtime cover every stage of its plan",
        )
    return tapset


def recapture(
    runtime, own: TapSet, inputs: ModelInputs, plan: StagePlan, stages: list[str], out_base: Path
) -> tuple[TapSet, str]:
    """(the stages' TapSet, how they were captured): re-run from the stored inputs where the runtime replays,
    else a targeted forward."""
    way = how(runtime)
    if way is None:
        raise RecaptureError(
            f"{runtime.label}'s taps come from a file: stages it did not write cannot be captured",
            "write those stages into the TapSet, or list them under stages: include",
        )
    if way == RERUN:
        return rerun_from_stored(runtime, own, plan, stages, out_base), way
    return targeted_forward(runtime, inputs, plan, stages, out_base), way


def _meta(own: TapSet, way: str) -> dict:
    keep = ("runtime", "label", "policy", "patch", "versions", "inputs_digest", "checkpoint", "family", "options")
    kept = {key: own.meta[key] for key in keep if key in own.meta}
    return {**kept, "recaptured": way, "recaptured_from": own.tensor_path.name}
