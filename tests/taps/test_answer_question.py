"""Answer evidence only where the answer is in question (``taps.answer_question``), on real runtimes: the tiny
Qwen2.5-VL, transformers f32 as the reference, eager MLX candidates fed its answer (``run.candidates.
teacher_force``) under the strict contract (an f32 port's round-off).

The decision is checked against an independent reading of the same candidate captured with ``forced: always``
(its full forced logits): an f32 MLX whose answer is not in question took nothing, and every criterion really is
clear; a planted defect that changes no token but the logits does put it in question (its top-5 at step 0), a
text-layer defect (its tokens) too, and each then carries the whole evidence the judge needs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import ROOT
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.core.numeric import margin_band
from driftscope.families import get_family
from driftscope.judge.contract import load_contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.judge.verdict import judge
from driftscope.run.candidates import teacher_force
from driftscope.taps.answer_question import AnswerQuestion, reference_answer
from driftscope.taps.sink import EVIDENCE_STAGES
from driftscope.taps.stages import StagePlan

NAME = "qwen2_5_vl"
STEPS = 4
PATCHES = str(ROOT / "tests" / "planted_patches.py")
STRICT = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")


@pytest.fixture(scope="module")
def answer(tiny, tmp_path_factory):
    """(the text plan, the reference's TapSet, capture(mode, patch=None) -> a MLX candidate's TapSet)."""
    out = tmp_path_factory.mktemp("answer-question")
    checkpoint, base, plan = tiny(NAME)
    text_plan = StagePlan(plan.family, [s for s in plan if s.id.startswith("text.")], plan.depth, dict(plan.meta))
    inputs = copy.deepcopy(base)
    inputs.text = get_family(NAME).text_inputs(checkpoint, inputs, max_new_tokens=STEPS)
    runtime = get_runtime("transformers")(checkpoint, "f32")
    reference = runtime.capture(inputs, text_plan, out / "reference")
    runtime.release()
    captured = {}

    def capture(mode: str, patch: dict | None = None):
        key = (mode, repr(patch))
        if key not in captured:
            fed = copy.deepcopy(inputs)
            teacher_force(fed, reference, STRICT, mode)
            runtime = get_runtime("mlx")(checkpoint, "f32", parse_patch(patch) if patch else None)
            captured[key] = runtime.capture(fed, text_plan, out / f"mlx-{mode}-{len(captured)}")
            runtime.release()
        return captured[key]

    return text_plan, reference, capture


def test_an_agreeing_f32_candidate_takes_no_evidence_and_still_passes(answer):
    plan, reference, capture = answer
    auto, always = capture("auto"), capture("always")
    for stage in EVIDENCE_STAGES:
        assert stage in always and stage not in auto, stage
        assert "not in question" in auto.meta["declared_absent"][stage]
    assert auto.meta["answer_evidence"] == {
        "mode": "auto",
        "in_question": False,
        "why": [],
        "teacher_forcing": False,
        "topk_maps": False,
        "kv_cache": False,
    }
    assert always.meta["answer_evidence"]["teacher_forcing"] is True
    assert "forced: always" in always.meta["answer_evidence"]["why"][0]
    # independently, from the full forced logits the `always` capture holds: none of the criteria holds
    r, c = np.asarray(reference[FORCED], np.float64), np.asarray(always[FORCED], np.float64)
    np.testing.assert_array_equal(auto["text.generate.tokens"], reference["text.generate.tokens"])
    np.testing.assert_array_equal(auto["text.generate.margins"], always["text.generate.margins"])
    top5 = STRICT.tolerance("text.forced.top5")
    for row_r, row_c in zip(r, c, strict=True):
        for row in (row_r, row_c):
            b, a = np.sort(row)[-2:]
            assert a - b > margin_band(a, b, top5.atol, top5.rtol, "float32")
        best = np.argsort(-row_r)[:5]
        assert np.all(np.abs(row_c[best] - row_r[best]) <= top5.bound(row_r[best]))
    margins = STRICT.tolerance("text.generate.margins")
    expected = np.asarray(reference["text.generate.margins"])
    assert np.all(np.abs(np.asarray(auto["text.generate.margins"]) - expected) <= margins.bound(expected))
    # the verdict: the answer passes, and the stages it did not take are declared, not missing
    verdict = judge(reference, [auto], STRICT, plan)
    assert verdict["verdict"]["per_candidate"][auto.label] == "pass", verdict["verdict"]["reasons"]
    coverage = verdict["coverage"][auto.label]
    assert coverage["complete"] and coverage["declared_absent"] == len(EVIDENCE_STAGES)
    assert forced_pair(reference, auto, STRICT) is None


def test_a_defect_that_changes_no_token_puts_the_answer_in_question_by_its_logits(answer):
    """The reference's top-1 logit boosted by 1e-3 of itself at every step: the same tokens, larger margins."""
    plan, reference, capture = answer
    tokens = [int(t) for t in np.asarray(reference["text.generate.tokens"])]
    patch = {"callable": f"{PATCHES}:scale_logits", "kwargs": {"tokens": sorted(set(tokens)), "factor": 1.001}}
    candidate = capture("auto", patch)
    np.testing.assert_array_equal(candidate["text.generate.tokens"], reference["text.generate.tokens"])
    evidence = candidate.meta["answer_evidence"]
    assert evidence["in_question"] and evidence["teacher_forcing"] and evidence["kv_cache"]
    assert evidence["why"][0].startswith(("top-5: step 0", "margin: step 0")), evidence["why"]
    assert all(stage in candidate for stage in EVIDENCE_STAGES)
    forced = forced_pair(reference, candidate, STRICT)
    assert forced["fed_reference_tokens"] is True and forced["first_divergence"] == 0
    assert judge(reference, [candidate], STRICT, plan)["verdict"]["per_candidate"][candidate.label] == "fail"


def test_a_text_defect_that_changes_the_tokens_takes_the_whole_evidence(answer):
    plan, reference, capture = answer
    candidate = capture("auto", {"callable": f"{PATCHES}:scale_text_layer", "kwargs": {"layer": 0, "factor": 4.0}})
    ours, theirs = np.asarray(candidate["text.generate.tokens"]), np.asarray(reference["text.generate.tokens"])
    parted = int(np.flatnonzero(ours != theirs)[0])
    evidence = candidate.meta["answer_evidence"]
    assert evidence["why"][0] == f"tokens: the greedy tokens differ from the reference's from step {parted}"
    np.testing.assert_array_equal(candidate["text.forced.tokens"], theirs)  # fed the reference's answer
    assert candidate.shape(FORCED)[0] == STEPS and "text.cache.forced.keys" in candidate
    assert forced_pair(reference, candidate, STRICT)["confident_flips"] >= 1


def test_the_rule_weighs_each_criterion():
    """Each criterion alone, on hand-made logits: a near tie of the candidate's or the reference's, a top-5 logit
    out of tolerance, a margin out of tolerance; and a clear answer."""
    reference_rows = np.array([[5.0, 3.0, 1.0, 0.5, 0.2, 0.1], [0.0, 4.0, 1.0, 0.5, 0.2, 0.1]])
    answer = reference_answer([0, 1], [2.0, 3.0], reference_rows)
    np.testing.assert_array_equal(answer["top_tokens"][0], [0, 1, 2, 3, 4])

    def weigh(rows, margins=None, tokens=(0, 1), reference=answer):
        question = AnswerQuestion("auto", reference, (0.01, 0.0, 0.0), (0.05, 0.0, 0.0))
        margins = [float(np.sort(r)[-1] - np.sort(r)[-2]) for r in rows] if margins is None else margins
        return question.weigh(list(tokens), margins, [np.asarray(r) for r in rows])

    assert weigh(reference_rows) == []
    differ = "tokens: the greedy tokens differ from the reference's from step 1"
    assert weigh(reference_rows, tokens=(0, 2))[0] == differ
    tie = reference_rows.copy()
    tie[1, 2] = 3.985  # the candidate's margin 0.015 <= 0.01 + 0.01
    assert weigh(tie)[0].startswith("near tie: step 1's margin 0.015")
    shifted = reference_rows.copy()
    shifted[0, 4] += 0.02  # a top-5 logit off by 0.02 > 0.01, the margin unchanged
    assert weigh(shifted)[0].startswith("top-5: step 0")
    assert weigh(reference_rows, margins=[2.06, 3.0])[0].startswith("margin: step 0")
    near = dict(answer, margins=np.array([2.0, 0.015]))
    assert weigh(reference_rows, reference=near)[0].startswith("near tie: the reference's margin at step 1")
