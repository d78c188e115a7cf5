"""Which side caused the answer's divergence, and whether it is what half precision costs.

Substitution, for each pair whose teacher-forced answer flips confidently or breaks a top-k tolerance: the
candidate's text side run, teacher-forced on the reference's tokens, on the **reference's** merged image embeddings
(``text.embeds.image``), and the reference's text side on the **candidate's**. The candidate's side with the
reference's tower clean and the reference's side with the candidate's tower diverging: *the tower's output
explains it*; the other way round: *the text side explains it*; both diverging: both sides; neither: the two
interact. A runtime whose text side cannot take substituted embeddings says so in the pair's entry.
(Features a decoder adds to its image rows itself stay each runtime's own.)

A pair whose only flips are near-ties (the reference's margin within the band the candidate's policy allows,
``judge.forced``) and whose teacher-forced logits stay within the contract at every step is not substituted: the
verdict reports such a flip and does not fail it, so there is nothing to attribute, and the two runs are whole
teacher-forced text captures (11 minutes of a 7B investigation's 27).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np

from driftscope.core.names import safe_name
from driftscope.errors import DriftscopeError
from driftscope.judge.forced import forced_pair
from driftscope.judge.three_way import half_peer, three_way
from driftscope.taps.stages import StagePlan

TEXTS = {
    "tower": "the tower's output explains it: the candidate's text side on the reference's image embeddings "
    "agrees, the reference's on the candidate's diverges",
    "text": "the text side explains it: the candidate's text side diverges on the reference's image embeddings "
    "too, the reference's agrees on the candidate's",
    "both": "both sides: the divergence stays with either tower's output",
    "neither": "neither substitution alone reproduces it: the tower and the text side interact",
}


def _diverges(forced: dict | None) -> bool:
    return bool(forced) and (forced.get("first_divergence") is not None or bool(forced.get("flips")))


def _near_ties_only(forced: dict) -> bool:
    """Every flip a near-tie and the teacher-forced logits within the contract: what the verdict only reports."""
    flips = forced.get("flips") or []
    return bool(flips) and forced.get("first_divergence") is None and all(f["label"] == "near-tie" for f in flips)


def _summary(forced: dict, tapset, out: Path) -> dict:
    return {
        "status": forced["status"],
        "first_divergence": forced["first_divergence"],
        "flips": len(forced["flips"]),
        "confident_flips": forced["confident_flips"],
        "tapset": str(Path(tapset.tensor_path).relative_to(out)),
    }


def _run_substituted(runtime, inputs, plan: StagePlan, embeds: np.ndarray, tokens: np.ndarray, where: Path):
    run_inputs = copy.copy(inputs)
    run_inputs.text = dataclasses.replace(  # teacher-forced whatever its answer: the forced logits are the point
        inputs.text, forced=tokens.copy(), image_embeds=embeds, reference_answer={}, evidence_rule=None
    )
    try:
        return runtime.capture(run_inputs, plan, where)
    finally:
        runtime.release()


def substitution(
    pair: dict, runtimes: dict, inputs, tapsets: dict, contract, plan: StagePlan, out: Path, log=lambda line: None
) -> dict:
    """One pair's substitution entry (``answer.pairs[i].substitution``); ``log`` is told before each of its two runs
    starts (each is a whole teacher-forced text capture: minutes on a large model)."""
    ref, cand = pair["reference"], pair["candidate"]
    if not _diverges(pair.get("forced")):
        return {"status": "not_needed", "text": "the teacher-forced answers agree: nothing to attribute"}
    if _near_ties_only(pair["forced"]):
        steps = ", ".join(str(f["step"]) for f in pair["forced"]["flips"])
        return {
            "status": "not_needed",
            "text": f"only near-tie flips (step {steps}) within the band its policy allows, the teacher-forced logits "
            "within tolerance: reported, not failed, so nothing to attribute",
        }
    missing = [label for label in (ref, cand) if not getattr(runtimes.get(label), "substitutes", False)]
    if missing:
        return {
            "status": "unavailable",
            "text": f"{', '.join(missing)} cannot take substituted image embeddings for this family",
        }
    reference, candidate = tapsets[ref], tapsets[cand]
    if not {"text.embeds.image", "text.generate.tokens"} <= set(reference.stage_ids()) or (
        "text.embeds.image" not in candidate
    ):
        return {"status": "unavailable", "text": "text.embeds.image was not captured on both sides"}
    text_plan = StagePlan(plan.family, [s for s in plan if s.id.startswith("text.")], plan.depth, dict(plan.meta))
    tokens = np.asarray(reference["text.generate.tokens"], dtype=np.int64)
    base = out / "taps" / "substitution" / safe_name(cand)
    steps = f"{len(tokens)} teacher-forced tokens"
    try:
        log(f"  substitution {cand}: {cand}'s text side on {ref}'s image embeddings ({steps}) ...")
        a = _run_substituted(
            runtimes[cand], inputs, text_plan, np.asarray(reference["text.embeds.image"]), tokens, base / "cand"
        )
        log(f"  substitution {cand}: {ref}'s text side on {cand}'s image embeddings ({steps}) ...")
        b = _run_substituted(
            runtimes[ref], inputs, text_plan, np.asarray(candidate["text.embeds.image"]), tokens, base / "ref"
        )
    except DriftscopeError as err:
        return {"status": "unavailable", "text": f"substitution could not run: {err}"}
    with_reference_tower, with_candidate_tower = (
        forced_pair(reference, a, contract),
        forced_pair(reference, b, contract),
    )
    kind = {(False, True): "tower", (True, False): "text", (True, True): "both", (False, False): "neither"}[
        (_diverges(with_reference_tower), _diverges(with_candidate_tower))
    ]
    return {
        "status": "done",
        "verdict": kind,
        "text": TEXTS[kind],
        "candidate_text_on_reference_tower": _summary(with_reference_tower, a, out),
        "reference_text_on_candidate_tower": _summary(with_candidate_tower, b, out),
    }


def explain_answer(params, report, out: Path, runtimes: dict, inputs, tapsets: dict, contract, plan, log) -> None:
    """Substitution for each diverging pair and the three-way verdict with a half-precision peer, into
    ``report.data["answer"]``."""
    answer = report.data.get("answer")
    if not answer:
        return
    report.step("substitution")
    for pair in answer["pairs"]:
        pair["substitution"] = substitution(pair, runtimes, inputs, tapsets, contract, plan, out, log)
        log(f"  substitution {pair['candidate']}: {pair['substitution']['text']}")
    peer = half_peer(tapsets, params.reference_label, (params.relative or {}).get("peer"))
    if peer is not None:
        answer["three_way"] = three_way(tapsets, params.reference_label, peer, contract)
    report.save()
