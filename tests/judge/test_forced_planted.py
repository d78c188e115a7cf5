"""Flips a precision can explain, planted in a real runtime (not in the judge's inputs): a 1e-3 logit-scale change
and a real text-side defect, each teacher-forced on transformers f32's greedy tokens (run.candidates.teacher_force)
and judged by judge.forced.

The tiny Qwen2.5-VL's margins are mostly 0.02-0.3 (relative 1e-2 to 1e-1), which a 1e-3 change cannot flip. The
prompt below was found by searching prompts of random words: at step 0 the reference's top-1 (token 93) leads
its runner-up (241) by 0.0012, 4e-4 of the logit; at step 2 the same runner-up trails by 0.22. The plant scales
the runner-up's logit by 1 + 1e-3 in every step (a uniform scale reorders nothing): it flips step 0 and leaves
step 2 alone. Every expectation is computed again from the stored logits."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import get_family
from driftscope.judge.contract import Contract, load_contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.run.candidates import teacher_force
from driftscope.run.substitution import substitution
from driftscope.taps.stages import StagePlan

NAME = "qwen2_5_vl"
PROMPT = "where shape describe square is name"
STEPS = 4
PATCHES = str(ROOT / "tests" / "planted_patches.py")
SCALE = 1e-3
#: a contract that allows what the plant costs (1e-3 of a logit): a flip it causes is one a precision explains
ALLOWS_IT = Contract.from_dict({"stages": [{"pattern": "text.forced.*", "atol": SCALE, "rtol": SCALE}]})
STRICT = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
DEFECT = {"callable": f"{PATCHES}:scale_text_layer", "kwargs": {"layer": 0, "factor": 4.0}}


@pytest.fixture(scope="module")
def answer(tiny, tmp_path_factory):
    """(inputs with the reference's tokens as ``forced``, the reference's TapSet, capture(runtime, patch))."""
    out = tmp_path_factory.mktemp("forced-planted")
    checkpoint, base, plan = tiny(NAME)
    answer_stages = [s for s in plan if s.id.startswith("text.")]  # the tower runs, untapped
    text_plan = StagePlan(plan.family, answer_stages, plan.depth, dict(plan.meta))
    inputs = copy.deepcopy(base)
    inputs.text = get_family(NAME).text_inputs(checkpoint, inputs, prompt=PROMPT, max_new_tokens=STEPS)
    runtime = get_runtime("transformers")(checkpoint, "f32")
    reference = runtime.capture(inputs, text_plan, out / "reference")  # free-running: what users see
    runtime.release()
    teacher_force(inputs, reference)  # what run.investigation does once the reference has decoded

    def capture(name: str, patch: dict):
        runtime = get_runtime(name)(checkpoint, "f32", parse_patch(patch))
        tapset = runtime.capture(inputs, text_plan, out / f"{name}-{patch['callable'].rsplit(':', 1)[1]}")
        runtime.release()
        return tapset

    return inputs, reference, capture


def _allowed(contract: Contract, *values: float) -> float:
    tolerance = contract.tolerance("text.forced.top5")
    return sum(tolerance.atol + tolerance.rtol * abs(v) for v in values)


@pytest.mark.parametrize("runtime_name", ["mlx", pytest.param("transformers", marks=pytest.mark.slow)])
def test_a_planted_1e3_logit_scale_flips_only_the_tiny_margin_step_and_it_is_a_near_tie(answer, runtime_name):
    inputs, reference, capture = answer
    r = np.asarray(reference[FORCED], np.float64)
    assert np.array_equal(inputs.text.forced, np.asarray(reference["text.generate.tokens"]))
    order = np.argsort(-r, axis=-1)
    boosted = int(order[0, 1])  # step 0's runner-up
    margins = r[np.arange(STEPS), order[:, 0]] - r[np.arange(STEPS), order[:, 1]]
    # the fixture's premise: a tiny margin at step 0, a large one at step 2 where the same token is the runner-up
    assert margins[0] < SCALE * r[0, boosted] < 0.01 and order[2, 1] == boosted and margins[2] > 0.1, margins
    candidate = capture(runtime_name, {"callable": f"{PATCHES}:scale_logits", "kwargs": {"tokens": [boosted]}})
    c = np.asarray(candidate[FORCED], np.float64)
    np.testing.assert_array_equal(np.asarray(candidate["text.forced.tokens"]), inputs.text.forced)
    # independently: the steps where boosting that logit by 1e-3 of itself overtakes the reference's top-1
    expected = [s for s in range(STEPS) if order[s, 0] != boosted and r[s, boosted] * (1 + SCALE) > r[s, order[s, 0]]]
    assert expected == [0]
    np.testing.assert_allclose(c[:, boosted], r[:, boosted] * (1 + SCALE), rtol=0, atol=2e-5)

    result = forced_pair(reference, candidate, ALLOWS_IT)
    assert result["fed_reference_tokens"] is True and [f["step"] for f in result["flips"]] == expected
    (flip,) = result["flips"]
    a = int(order[0, 0])
    assert (flip["reference_token"], flip["candidate_token"]) == (a, boosted)
    assert flip["reference_margin"] == pytest.approx(margins[0], abs=1e-9)
    assert flip["allowed"] == pytest.approx(_allowed(ALLOWS_IT, r[0, a], r[0, boosted]), rel=1e-6)
    assert flip["label"] == "near-tie" and result["confident_flips"] == 0
    assert result["first_divergence"] is None  # the change is within what this contract allows at every step
    assert not result["steps"][2]["flipped"] and result["steps"][2]["reference_margin"] > 0.1
    # free-running, the candidate already differs at step 0; teacher-forced, steps 1.. agree
    assert int(np.asarray(candidate["text.generate.tokens"])[0]) == boosted != int(inputs.text.forced[0])
    # under the strict contract (1e-4: an f32 port's round-off) the same 1e-3 change is more than the policy
    # allows: the flip is confident and step 0 diverges
    strict = forced_pair(reference, candidate, STRICT)
    assert [f["label"] for f in strict["flips"]] == ["confident"] and strict["first_divergence"] == 0
    assert margins[0] > _allowed(STRICT, r[0, a], r[0, boosted])


def test_a_real_text_side_defect_flips_confidently_under_the_same_contract(answer):
    inputs, reference, capture = answer
    candidate = capture("mlx", DEFECT)
    r, c = np.asarray(reference[FORCED], np.float64), np.asarray(candidate[FORCED], np.float64)
    result = forced_pair(reference, candidate, ALLOWS_IT)
    flipped = [s for s in range(STEPS) if int(np.argmax(c[s])) != int(np.argmax(r[s]))]
    assert flipped and [f["step"] for f in result["flips"]] == flipped
    for flip in result["flips"]:
        a, t = flip["reference_token"], flip["candidate_token"]
        margin = r[flip["step"], a] - r[flip["step"], t]
        assert flip["reference_margin"] == pytest.approx(margin, abs=1e-9)
        assert flip["allowed"] == pytest.approx(_allowed(ALLOWS_IT, r[flip["step"], a], r[flip["step"], t]), rel=1e-6)
        assert flip["label"] == ("confident" if margin > flip["allowed"] else "near-tie")
    assert result["confident_flips"] >= 1 and result["first_divergence"] == 0
    assert max(f["reference_margin"] for f in result["flips"]) > 10 * ALLOWS_IT.tolerance("text.forced.top5").atol


@pytest.fixture(scope="module")
def text_plan(tiny):
    _, _, plan = tiny(NAME)
    return StagePlan(plan.family, [s for s in plan if s.id.startswith("text.")], plan.depth, dict(plan.meta))


def test_a_near_tie_flip_within_the_policys_band_is_reported_not_failed(answer, text_plan):
    """The 1e-3 plant under a contract that allows it: the free-running tokens part at step 0 by a near-tie, so
    the verdict reports it (a warning on the row, no divergence, not "data"), while the teacher-forced answer
    goes on being compared at every step."""
    from driftscope.judge.compare import compare_tapsets, first_divergence
    from driftscope.judge.verdict import judge

    inputs, reference, capture = answer
    boosted = int(np.argsort(-np.asarray(reference[FORCED], np.float64)[0])[1])
    candidate = capture("mlx", {"callable": f"{PATCHES}:scale_logits", "kwargs": {"tokens": [boosted]}})
    assert int(np.asarray(candidate["text.generate.tokens"])[0]) != int(inputs.text.forced[0])  # they part
    rows = {row.stage: row for row in compare_tapsets(reference, candidate, ALLOWS_IT, text_plan)}
    tokens = rows["text.generate.tokens"]
    assert tokens.status == "pass" and tokens.failures > 0
    assert tokens.extra["near_tie"]["step"] == 0 and "near-tie flip" in tokens.warning
    assert rows["text.generate.margins"].status == "pass"
    assert first_divergence(list(rows.values())) is None
    verdict = judge(reference, [candidate], ALLOWS_IT, text_plan)
    assert verdict["verdict"]["per_candidate"][candidate.label] == "pass"
    assert any("near-tie flip" in reason for reason in verdict["verdict"]["reasons"])  # reported
    assert forced_pair(reference, candidate, ALLOWS_IT)["steps_compared"] == STEPS  # teacher forcing carries on
    # and substitution (two whole teacher-forced text captures) does not run for it: nothing to attribute; under
    # the strict contract the same flip is confident, and it would (here: no runtimes given, so "unavailable")
    tapsets = {"ref": reference, "cand": candidate}
    entries = {}
    for contract, expected in ((ALLOWS_IT, "not_needed"), (STRICT, "unavailable")):
        pair = {"reference": "ref", "candidate": "cand", "forced": forced_pair(reference, candidate, contract)}
        entries[expected] = substitution(pair, {}, inputs, tapsets, contract, text_plan, Path("."))
        assert entries[expected]["status"] == expected, entries[expected]
    assert "near-tie flips (step 0)" in entries["not_needed"]["text"]


def test_a_confident_flip_fails_the_verdict(answer, text_plan):
    """The same plant under the strict contract (its 1e-3 is more than an f32 port may cost: confident), and a
    real text-side defect under the lenient one: the free-running tokens' row fails, saying why."""
    from driftscope.judge.compare import compare_tapsets

    inputs, reference, capture = answer
    boosted = int(np.argsort(-np.asarray(reference[FORCED], np.float64)[0])[1])
    planted = capture("mlx", {"callable": f"{PATCHES}:scale_logits", "kwargs": {"tokens": [boosted]}})
    for candidate, contract in ((planted, STRICT), (capture("mlx", DEFECT), ALLOWS_IT)):
        rows = {row.stage: row for row in compare_tapsets(reference, candidate, contract, text_plan)}
        tokens = rows["text.generate.tokens"]
        assert tokens.status == "fail" and "confident flip at step 0" in tokens.note
