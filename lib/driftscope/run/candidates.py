"""Judging one candidate against the reference right after its capture, while its model is still loaded:
compare, narrow the pair down to the finest declared stage, replay the candidate on the reference's stage
inputs, and record the narrowing, the labels and the conclusion in the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from driftscope.replay.narrowing import Side, judge_pair
from driftscope.taps.stages import StagePlan


@dataclass
class Pairs:
    """What judging each candidate against the reference shares: the full plan narrowing refines into, every
    runtime by label, the reference's recaptured stages, and each narrowed pair's sides."""

    full: StagePlan
    runtimes: dict
    cache: object
    reference: str  # the reference runtime's label
    narrow: bool  # narrow a pair's first divergence down to the finest declared stage
    sides: dict = field(default_factory=dict)  # candidate label -> (reference, candidate) TapUnions
    added: set = field(default_factory=set)


def teacher_force(inputs, reference, contract=None, mode: str = "auto") -> None:
    """Once the reference has decoded, every candidate that decodes is also fed its greedy tokens
    (``TextInputs.forced``: the candidates' ``text.forced.*``); the reference itself free-ran. With ``contract``,
    each candidate takes that evidence only where its answer is in question (``taps.answer_question``: ``mode``
    "auto"), or always (``mode`` "always", the parameter file's ``text: {forced: always}``)."""
    text = getattr(inputs, "text", None)
    if text is None or text.forced is not None or reference is None or "text.generate.tokens" not in reference:
        return
    import numpy as np

    from driftscope.taps.answer_question import evidence_rule, reference_answer

    text.forced = np.asarray(reference["text.generate.tokens"], dtype=np.int64).copy()
    if contract is None or "text.forced.logits" not in reference or "text.generate.margins" not in reference:
        return
    logits = "text.forced.logits"
    rows = (reference.rows(logits, index, index + 1)[0] for index in range(reference.shape(logits)[0]))
    text.reference_answer = reference_answer(text.forced, reference["text.generate.margins"], rows)
    top5, margins = contract.tolerance("text.forced.top5"), contract.tolerance("text.generate.margins")
    text.evidence_rule = evidence_rule(
        mode,
        (top5.atol, top5.rtol, top5.max_failure_fraction),
        (margins.atol, margins.rtol, margins.max_failure_fraction),
    )


def with_ready_patches(
    conclusion: dict,
    family: str,
    runtime: str,
    own: str | None = None,
    model_type: str | None = None,
    activations: str | None = None,
) -> dict:
    """``conclusion`` with the ready patches its family declares for the operator it says introduces the error,
    or for the data stage (index math, e.g. positions) or the stage no replay reaches that first differs
    (``ready_patches``: absent where none matches or nothing is introduced), but the candidate's ``own`` and those
    that cannot apply to a runtime computing in ``activations`` (a float32 norm patch on a float32 runtime)."""
    from driftscope.families import get_family

    kind = conclusion.get("kind")
    if kind not in ("introduced", "data", "unreplayed"):
        return conclusion
    stage = conclusion.get("stage") or conclusion.get("first_divergence")  # unreplayed: where the error enters
    patches = [p for p in get_family(family).ready_patches(stage, runtime, model_type, activations) if p != own]
    return {**conclusion, "ready_patches": patches} if patches else conclusion


def judge_candidate(
    report, out: Path, runtime, inputs, plan: StagePlan, contract, tapsets: dict, pairs: Pairs, replay: bool, log
) -> list:
    """Compare one candidate with the reference, narrow the pair and replay it on the reference's stage inputs
    (introduced/inherited/amplified labels, the conclusion). Returns the pair's rows, which ``judge`` reuses."""
    label, reference = runtime.label, tapsets[pairs.reference]
    report.step(f"replay:{label}")
    reference_runtime = pairs.runtimes[pairs.reference]
    result = judge_pair(
        Side(reference_runtime, reference),
        Side(runtime, tapsets[label]),
        inputs,
        plan,
        pairs.full,
        contract,
        out,
        label,
        narrow=pairs.narrow,
        replay=replay,
        cache=pairs.cache,
        log=log,
    )
    reference_runtime.release()  # narrowing may have loaded it again
    if result.narrowing["steps"]:
        report.data["narrowing"][label] = result.narrowing
        pairs.sides[label] = (result.reference, result.candidate)
        pairs.added.update(result.narrowing["added"])
    if result.drill is not None:
        entry = result.drill.to_dict()
        entry["tapset"] = str(Path(entry["tapset"]).relative_to(out))
        report.data["replay"][label] = entry
        controls = runtime.same_input_controls(reference, plan)  # e.g. quantized linears, fused and dequantized
        if controls is not None:
            from driftscope.capture.linear_controls import linear_verdict

            report.data.setdefault("linear_replay", {})[label] = linear_verdict(controls, result.drill.labels, label)
            log(f"  {report.data['linear_replay'][label]['verdict']}")
    report.data["conclusions"][label] = with_ready_patches(
        result.conclusion,
        plan.family,
        runtime.name,
        runtime.patch.target if runtime.patch else None,
        plan.meta.get("model_type"),
        runtime.policy.activations,
    )
    log(f"  {label}: {result.conclusion['text']}")
    report.save()
    return result.rows
