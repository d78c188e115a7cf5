"""One input's judgement: each candidate against the reference on the tower output and the answer, and the
divergence score that ranks the inputs.

**The divergence score** of a candidate on an input is the sum of five terms, each 0 when the candidate agrees
with the reference and each at most about 1 (so the score reads as "how many ways it deviates"):

- ``tower``: the tower output's relative RMS error, ``rms(c - r) / rms(r)``, capped at 1 (0.001 is float16
  round-off; ~1 is an unrelated output, e.g. tokens in the wrong place); the worst of the tower outputs;
- ``failures``: the share of the tower output's elements over the contract's tolerance ``atol + rtol * |r|``;
- ``prefill``: 1 when the prefill's top-1 token differs from the reference's, else 0;
- ``greedy``: ``1 - s / n`` when the greedy answers first differ at step ``s`` of ``n``, else 0 (an answer that
  differs at its first token scores 1);
- ``words``: the share of the expected words the reference says that the candidate's answer drops.

A flip the teacher-forced decode labels **near-tie** (the reference's top two tokens within the error the
candidate's policy allows: noise, not a defect) is discounted: when the answers first differ at a near-tie, the
``prefill``, ``greedy`` and ``words`` terms count ``NEAR_TIE_WEIGHT`` of their value (the page labels the step).

An input's score is its worst candidate's; ties are broken by the tower output's share of its tolerance. A
candidate that could not run on an input scores nothing and is listed as such (it is not a deviation of the input).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from driftscope.judge.compare import compare_tapsets, logit_agreement
from driftscope.judge.contract import Contract
from driftscope.screen.capture import Job, error_path, tap_base
from driftscope.screen.inputs import ScreenInput
from driftscope.screen.plan import tower_outputs
from driftscope.taps.tapset import TapSet

SCORE_TERMS = ("tower", "failures", "prefill", "greedy", "words")
#: what an answer that first differs at a near-tie flip counts of its answer terms (module docstring)
NEAR_TIE_WEIGHT = 0.05


def _finite(value, default: float = 0.0) -> float:
    value = default if value is None else float(value)
    return value if math.isfinite(value) else 1.0


def divergence_score(candidate: dict) -> dict:
    """The five terms of ``candidate``'s score and their sum (see the module's docstring)."""
    tower = min(1.0, _finite(candidate.get("tower_relative_error")))
    failures = _finite(candidate.get("tower_failure_fraction"))
    prefill = 0.0 if candidate.get("prefill_top1_agree", True) else 1.0
    first, steps = candidate.get("first_difference"), candidate.get("steps") or 0
    greedy = 0.0 if first is None or not steps else 1.0 - first / steps
    said = [w for w, ok in (candidate.get("reference_words") or {}).items() if ok]
    dropped = [w for w in said if not (candidate.get("expected_words") or {}).get(w)]
    words = len(dropped) / len(said) if said else 0.0
    weight = NEAR_TIE_WEIGHT if candidate.get("first_difference_label") == "near-tie" else 1.0
    prefill, greedy, words = prefill * weight, greedy * weight, words * weight
    terms = {"tower": tower, "failures": failures, "prefill": prefill, "greedy": greedy, "words": words}
    return {"score": float(sum(terms.values())), "terms": terms}


def _tower(rows, outputs: list[str]) -> dict:
    chosen = [row for row in rows if row.stage in outputs]
    elements = sum(row.elements for row in chosen)
    failures = sum(row.failures for row in chosen)
    worst = max(chosen, key=lambda row: _finite(row.relative_rms), default=None)
    return {
        "tower_stage": None if worst is None else worst.stage,
        "tower_status": "fail" if any(r.status == "fail" for r in chosen) else (worst.status if worst else "missing"),
        "tower_relative_error": None if worst is None else worst.relative_rms,
        "tower_max_abs": None if worst is None else worst.max_abs,
        "tower_failures": failures,
        "tower_elements": elements,
        "tower_failure_fraction": failures / elements if elements else 0.0,
        "tower_tolerance_used": max((r.tolerance_used or 0.0 for r in chosen), default=None),
    }


def _answer(checkpoint, reference: TapSet, candidate: TapSet, expect: list[str], contract: Contract, plan=None) -> dict:
    from driftscope.judge.answer import answer_parity

    if "text.generate.tokens" not in reference or "text.generate.tokens" not in candidate:
        return {}
    labels = (reference.label, candidate.label)
    parity = answer_parity(
        checkpoint,
        dict(zip(labels, (reference, candidate), strict=True)),
        labels[0],
        expect,
        [labels],
        contract=contract,
        plan=plan,
    )
    ref, cand = parity["runtimes"][labels[0]], parity["runtimes"][labels[1]]
    pair = parity["pairs"][0]
    out = {
        "steps": len(ref["tokens"]),
        "reference_text": ref["text"],
        "candidate_text": cand["text"],
        "first_difference": pair["first_difference"],
        "reference_token": pair["reference_token"],
        "candidate_token": pair["candidate_token"],
        "reference_words": ref["expected_words"],
        "expected_words": cand["expected_words"],
        "dropped_words": [entry["word"] for entry in pair["dropped_words"] if entry["in_reference"]],
        "forced_first_divergence": (pair["forced"] or {}).get("first_divergence"),
        "confident_flips": (pair["forced"] or {}).get("confident_flips"),
        "first_difference_label": _flip_label(pair),
    }
    if "text.logits.last" in reference and "text.logits.last" in candidate:
        agreement = logit_agreement(
            np.asarray(reference["text.logits.last"]), np.asarray(candidate["text.logits.last"])
        )
        out.update(
            # the greedy decode's own first token (np.argmax: the first of tied logits), not the stable sort's
            prefill_top1_agree=bool(pair["prefill_top1_agree"]),
            prefill_top5_overlap=agreement["top5_overlap"],
            prefill_margin_reference=agreement["margin_reference"],
            prefill_margin_candidate=agreement["margin_candidate"],
        )
    return out


def _flip_label(pair: dict) -> str | None:
    """The teacher-forced label (``near-tie``, ``confident``) of the flip at the step where the free-running answers
    first differ: both runtimes were asked the same question there. None when they do not differ or the step was
    not decoded teacher-forced."""
    first = pair.get("first_difference")
    flips = (pair.get("forced") or {}).get("flips") or []
    return next((flip["label"] for flip in flips if flip["step"] == first), None) if first is not None else None


def judge_input(job: Job, item: ScreenInput, contract: Contract) -> dict:
    """``item``'s result: per candidate the tower and answer metrics and the score; the input's score."""
    outputs = tower_outputs(job.plan)
    expect = list(item.expect) or list((job.text or {}).get("expect") or [])
    result = {**item.to_dict(), "expect": expect, "reference": job.reference, "candidates": {}, "could_not_run": {}}
    failed = {
        spec.display: json.loads(error_path(job.out, item.key, spec.display).read_text())["error"]
        for spec in job.specs
        if error_path(job.out, item.key, spec.display).exists()
    }
    if job.reference in failed:
        result["could_not_run"] = {job.reference: failed[job.reference]}
        result.update(score=None, worst=None, status="could not run")
        return result
    reference = TapSet(tap_base(job.out, item.key, job.reference))
    for spec in job.specs[1:]:
        label = spec.display
        if label in failed:
            result["could_not_run"][label] = failed[label]
            continue
        candidate = TapSet(tap_base(job.out, item.key, label))
        entry = _tower(compare_tapsets(reference, candidate, contract, job.plan), outputs)
        entry.update(_answer(job.checkpoint, reference, candidate, expect, contract, job.plan))
        entry.update(divergence_score(entry))
        result["candidates"][label] = entry
    scored = [(label, entry) for label, entry in result["candidates"].items()]
    worst = max(scored, key=lambda item: (item[1]["score"], _finite(item[1]["tower_tolerance_used"])), default=None)
    result.update(
        status="judged" if worst else "could not run",
        worst=None if worst is None else worst[0],
        score=None if worst is None else worst[1]["score"],
        tie_break=None if worst is None else _finite(worst[1]["tower_tolerance_used"]),
    )
    return result


def result_path(out: Path, key: str) -> Path:
    return Path(out) / "results" / f"{key}.json"
