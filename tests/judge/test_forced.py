"""The teacher-forced answer (judge.forced): top-k tolerance maps, the first divergence, flip labels, and the
greedy loop's forced pass (taps.sink.put_greedy) with a rewound cache.

The reference's forced logits are the tiny Qwen2.5-VL's own (transformers f32); the candidates are those
logits with planted changes, and every expectation is computed again from the raw arrays."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.judge.contract import FORCED_KEYS, Contract, load_contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.taps.sink import StageSink, decode_stages, put_greedy
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapWriter

STRICT = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
DEFAULT = load_contract(ROOT / "parameters" / "contracts" / "default.yaml")


@pytest.fixture(scope="module")
def reference_logits(runs):
    _, tapset = runs("qwen2_5_vl", "transformers")
    logits = np.array(tapset[FORCED], dtype=np.float32)
    tokens = np.asarray(tapset["text.generate.tokens"])
    assert logits.shape[0] == tokens.size and np.array_equal(logits.argmax(-1), tokens)  # its own greedy logits
    return logits


def _tapset(path, logits: np.ndarray, tokens: np.ndarray, policy: str = "f32", generated: np.ndarray | None = None):
    from driftscope.model.policies import get_policy

    plan = StagePlan("test", decode_stages(len(tokens)), 0, {})
    writer = TapWriter(path, {"runtime": "test", "label": path.name, "policy": get_policy(policy).to_dict()})
    writer.add_rows(plan[FORCED], iter(logits))
    writer.add(plan["text.generate.tokens"], tokens if generated is None else generated)
    writer.add(plan["text.forced.tokens"], tokens)
    return writer.close()


def test_two_candidates_fed_the_oracles_tokens_were_fed_the_same_whatever_each_said_itself(reference_logits, tmp_path):
    """A pair of two candidates (e.g. ``[mlx:f32, iree:f32]``): both were fed the oracle's tokens; the pair's
    reference free-ran to other tokens of its own. They were fed the same; a candidate fed others was not."""
    tokens = reference_logits.argmax(-1)
    own = (tokens + 1) % reference_logits.shape[1]  # what the pair's reference said free-running
    reference = _tapset(tmp_path / "r", reference_logits, tokens, generated=own)
    assert forced_pair(reference, _tapset(tmp_path / "c", reference_logits, tokens), STRICT)["fed_reference_tokens"]
    other = forced_pair(reference, _tapset(tmp_path / "o", reference_logits, own), STRICT)
    assert other["fed_reference_tokens"] is False and other["status"] == "fail"


def _with_margin(logits: np.ndarray, step: int, margin: float) -> np.ndarray:
    """``logits`` with step ``step``'s second-best token set ``margin`` below its best."""
    out = logits.copy()
    order = np.argsort(-out[step])
    out[step, order[1]] = out[step, order[0]] - np.float32(margin)
    return out


def test_a_planted_1e3_change_flips_a_near_tie_and_a_confident_margin_labelled_by_the_rule(reference_logits, tmp_path):
    small, large = 1, 2  # reference margins 1e-4 (within what strict allows) and 8e-4 (above it)
    ref = _with_margin(_with_margin(reference_logits, small, 1e-4), large, 8e-4)
    cand = ref.copy()
    for step in (small, large):  # the planted change: +1e-3 on the reference's second-best logit
        cand[step, np.argsort(-ref[step])[1]] += np.float32(1e-3)
    tokens = ref.argmax(-1)
    reference, candidate = _tapset(tmp_path / "ref", ref, tokens), _tapset(tmp_path / "cand", cand, tokens)

    result = forced_pair(reference, candidate, STRICT)
    flips = {flip["step"]: flip for flip in result["flips"]}
    assert set(flips) == {small, large}
    top5 = STRICT.tolerance("text.forced.top5")
    for step, expected in ((small, "near-tie"), (large, "confident")):
        a, b = np.argsort(-ref[step].astype(np.float64))[:2]
        margin = float(ref[step, a]) - float(ref[step, b])
        allowed = sum(top5.atol + top5.rtol * abs(float(ref[step, t])) for t in (a, b))
        assert flips[step]["reference_margin"] == pytest.approx(margin)
        assert flips[step]["allowed"] == pytest.approx(allowed)
        assert (margin <= allowed) == (expected == "near-tie")
        assert flips[step]["label"] == expected and flips[step]["candidate_token"] == b
    assert result["confident_flips"] == 1
    # under the default contract (an F16 port's tolerance) both flips are ones a precision can explain
    assert {flip["label"] for flip in forced_pair(reference, candidate, DEFAULT)["flips"]} == {"near-tie"}


def test_the_forced_first_divergence_is_the_first_step_any_topk_breaks_its_tolerance(reference_logits, tmp_path):
    ref = reference_logits
    rng = np.random.default_rng(0)
    cand = ref + rng.normal(0, 1e-6, ref.shape).astype(np.float32)  # f32 round-off everywhere

    def bound(key: str, value) -> float:
        tol = STRICT.tolerance(key)
        return tol.atol + tol.rtol * abs(float(value))

    tail, top = np.argsort(-ref[2])[300], np.argsort(-ref[3])[3]
    # far down step 2's ranking, past top1000's tolerance but inside all's: no top-5 or top-50 token moves
    cand[2, tail] = ref[2, tail] + np.float32(1.1 * bound("text.forced.top1000", ref[2, tail]))
    cand[3, top] = ref[3, top] + np.float32(3 * bound("text.forced.top5", ref[3, top]))  # one of step 3's top 5
    tokens = ref.argmax(-1)
    result = forced_pair(_tapset(tmp_path / "r", ref, tokens), _tapset(tmp_path / "c", cand, tokens), STRICT)

    def first(key: str, k):  # independently, from the raw arrays
        tol = STRICT.tolerance(key)
        for step in range(ref.shape[0]):
            idx = np.argsort(-ref[step].astype(np.float64), kind="stable")[: (k or ref.shape[1])]
            r, c = ref[step, idx].astype(np.float64), cand[step, idx].astype(np.float64)
            if np.any(np.abs(c - r) > tol.atol + tol.rtol * np.abs(r)):
                return step
        return None

    expected = {key: first(key, k) for k, key in FORCED_KEYS.items()}
    assert result["first_failing_step"] == expected
    found = [step for step in expected.values() if step is not None]
    assert result["first_divergence"] == min(found) and result["status"] == "fail"
    assert expected["text.forced.top5"] == expected["text.forced.top50"] == 3
    assert expected["text.forced.top1000"] == 2  # the tail breaks first: the answer diverges before its top-5 does
    assert result["flips"] == [] and result["fed_reference_tokens"] is True  # no argmax flipped: still diverges


def test_the_forced_keys_never_warn_as_rules_that_match_no_stage():
    assert DEFAULT.warnings(["vision.block.0"]) == [] and STRICT.warnings(["vision.block.0"]) == []
    assert DEFAULT.tolerance("text.forced.top1000").atol == pytest.approx(0.12)
    other = Contract.from_dict({"stages": [{"pattern": "vision.nothing", "atol": 1}]})
    assert other.warnings(["vision.block.0"]) == ["contract rule 'vision.nothing' matches no stage of the plan"]


class _Cache:
    """A toy cached decoder: logits are a function of the whole prefix fed so far."""

    def __init__(self, vocab: int = 11):
        self.fed: list[int] = []
        self.vocab = vocab

    def logits(self, prefix) -> np.ndarray:
        seed = sum((i + 1) * 31 * (t + 1) for i, t in enumerate(prefix)) % 9973
        return np.random.default_rng(seed).normal(size=self.vocab).astype(np.float32)

    def step(self, token: int) -> np.ndarray:
        self.fed.append(int(token))
        return self.logits(self.fed)

    def rewind(self, count: int) -> None:
        del self.fed[len(self.fed) - count :]


@pytest.mark.parametrize("agree", [0, 1, 2, 5])
def test_put_greedy_forces_the_given_tokens_sharing_the_agreeing_steps(tmp_path, agree):
    steps = 5
    cache = _Cache()
    greedy = [int(np.argmax(cache.logits([])))]
    for _ in range(steps - 1):
        greedy.append(int(np.argmax(cache.logits(greedy))))
    forced = greedy[:agree] + [(t + 1) % cache.vocab for t in greedy[agree:]]
    plan = StagePlan("test", decode_stages(steps), 0, {})
    calls = []
    writer = TapWriter(tmp_path / f"t{agree}", {"runtime": "test", "label": "t"})
    step = lambda token: (calls.append(token), cache.step(token))[1]  # noqa: E731
    put_greedy(StageSink(writer, plan), cache.logits([]), step, steps, forced=np.array(forced), rewind=cache.rewind)
    tapset = writer.close()
    assert np.asarray(tapset["text.generate.tokens"]).tolist() == greedy  # free-running is what users see
    assert np.asarray(tapset["text.forced.tokens"]).tolist() == forced
    expected = np.stack([cache.logits(forced[:i]) for i in range(steps)])  # no cache: each prefix afresh
    assert np.array_equal(np.asarray(tapset[FORCED]), expected)
    shared = min(agree + 1, steps)  # rows 0..agree come from the greedy steps themselves
    assert len(calls) == (steps - 1) + (steps - shared)


def test_texts_that_random_weights_decode_to_are_escaped_on_the_page():
    from driftscope.views.forced import escaped

    assert escaped("a\ufffdb\nc") == "a\\ufffdb\\nc" and escaped("red square") == "red square"
