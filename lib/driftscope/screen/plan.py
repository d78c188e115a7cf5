"""The screen's stage plan: the tower output and the answer, no per-block taps.

A family names what its text side reads of the tower in its plan's ``meta["tower_outputs"]``; a family that does
not is read as ending at its last vision stage. The stages a tower output's token order is undone with (its index
and segments) come along, so it is compared as the investigation compares it.
"""

from __future__ import annotations

from driftscope.taps.stages import StagePlan, orders_of

#: what the screen keeps of the text side: the prefill logits, the greedy answer, the teacher-forced logits
ANSWER_STAGES = (
    "text.logits.last",
    "text.generate.tokens",
    "text.generate.margins",
    "text.forced.tokens",
    "text.forced.logits",
)


def tower_outputs(plan: StagePlan) -> list[str]:
    """The stages the text side reads of the tower, in execution order."""
    declared = [stage for stage in plan.meta.get("tower_outputs") or () if stage in plan]
    if declared:
        return declared
    vision = [stage.id for stage in plan if stage.id.startswith("vision.") and not stage.integer and not stage.side]
    return vision[-1:]


def screen_plan(vision: StagePlan, text: list | None = None) -> StagePlan:
    """``vision`` (the family's full vision plan) cut to its tower outputs, plus the answer stages of ``text``
    (the family's text stages, or None for a tower-only screen)."""
    outputs = tower_outputs(vision)
    wanted = set(outputs)
    orders = orders_of(vision)
    for stage_id in outputs:
        order = orders.get(vision[stage_id].token_order)
        if order is not None:
            wanted.update(s for s in (order.index, order.segments) if s)
    stages = [stage for stage in vision if stage.id in wanted]
    stages += [stage for stage in text or () if stage.id in ANSWER_STAGES]
    return StagePlan(vision.family, stages, vision.depth, dict(vision.meta))
