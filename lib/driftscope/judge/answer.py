"""Answer parity: the greedy tokens of each runtime, where they first differ, the margins there, the texts; the
teacher-forced comparison of each pair (``judge.forced``) and which expected word each candidate drops, and at
which step the reference's token that says it lost its rank in the candidate."""

from __future__ import annotations

import re

import numpy as np

from driftscope.inputs.text_inputs import decode
from driftscope.judge.cache import cache_pair
from driftscope.judge.contract import Contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet


def _pieces(checkpoint, tokens: list[int]) -> list[str | None]:
    """Each token decoded alone; None for a token whose bytes are no whole UTF-8 character (the page shows its id)."""
    pieces = [decode(checkpoint, [token]) for token in tokens]
    return [None if "\ufffd" in piece else piece for piece in pieces]


def _words(text: str, expect: list[str]) -> dict[str, bool]:
    lowered = text.lower()
    return {word: bool(re.search(rf"\b{re.escape(word.lower())}\b", lowered)) for word in expect}


def answer_parity(
    checkpoint,
    tapsets: dict[str, TapSet],
    reference: str,
    expect: list[str],
    pairs: list[tuple[str, str]],
    context: int = 2,
    contract: Contract | None = None,
    plan: StagePlan | None = None,
) -> dict:
    """Per runtime: tokens, text, margins, expected words, and for a candidate weighed against the reference's
    answer which evidence it took and why (``evidence``, ``taps.answer_question``); per pair: the first differing
    token and its margins, the teacher-forced comparison (``forced``: top-k maps, first divergence, flips and their
    labels) and the expected words the candidate drops (``dropped_words``)."""
    contract = contract or Contract()
    runtimes = {}
    for label, tapset in tapsets.items():
        if "text.generate.tokens" not in tapset:
            continue
        tokens = [int(t) for t in np.asarray(tapset["text.generate.tokens"])]
        margins = [float(m) for m in np.asarray(tapset["text.generate.margins"])]
        text = decode(checkpoint, tokens)
        logits = np.asarray(tapset["text.logits.last"]) if "text.logits.last" in tapset else None
        runtimes[label] = {
            "tokens": tokens,
            "text": text,
            # a text with bytes no token completes as UTF-8 (U+FFFD): each token alone, None where it is such bytes
            **({"pieces": _pieces(checkpoint, tokens)} if "\ufffd" in text else {}),
            "margins": margins,
            "expected_words": _words(text, expect),
            "prefill_top1": None if logits is None else int(np.argmax(logits)),
            **({"evidence": tapset.meta["answer_evidence"]} if tapset.meta.get("answer_evidence") else {}),
        }
    comparisons = []
    for ref, cand in pairs:
        if ref not in runtimes or cand not in runtimes:
            continue
        a, b = runtimes[ref]["tokens"], runtimes[cand]["tokens"]
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        window = [] if first is None else list(range(max(0, first - context), min(len(a), first + context + 1)))
        comparisons.append(
            {
                "reference": ref,
                "candidate": cand,
                "identical": first is None and len(a) == len(b),
                "first_difference": first,
                "reference_token": None if first is None else a[first],
                "candidate_token": None if first is None else b[first],
                "margins_around": [
                    {"step": i, "reference": runtimes[ref]["margins"][i], "candidate": runtimes[cand]["margins"][i]}
                    for i in window
                ],
                "prefill_top1_agree": runtimes[ref]["prefill_top1"] == runtimes[cand]["prefill_top1"],
                "forced": forced_pair(tapsets[ref], tapsets[cand], contract),
                "cache": cache_pair(tapsets[ref], tapsets[cand], contract, plan),
                "dropped_words": dropped_words(checkpoint, runtimes[ref], runtimes[cand], tapsets[cand], expect),
            }
        )
    return {"reference": reference, "expect": expect, "runtimes": runtimes, "pairs": comparisons}


def _said_at(checkpoint, tokens: list[int], word: str) -> int | None:
    """The first step whose token completes ``word`` in the decoded prefix (None: the tokens never say it)."""
    for step in range(len(tokens)):
        if _words(decode(checkpoint, tokens[: step + 1]), [word])[word]:
            return step
    return None


def dropped_words(checkpoint, reference: dict, candidate: dict, tapset: TapSet, expect: list[str]) -> list[dict]:
    """Each expected word missing from the candidate's free-running text: the step at which the reference's
    token that says it comes, that token, and its rank among the candidate's teacher-forced logits at that step
    (0: the candidate would have said it too; the answer went elsewhere earlier)."""
    out = []
    for word in expect:
        if candidate["expected_words"].get(word):
            continue
        entry = {"word": word, "in_reference": bool(reference["expected_words"].get(word))}
        step = _said_at(checkpoint, reference["tokens"], word) if entry["in_reference"] else None
        entry["reference_step"] = step
        if step is not None:
            token = reference["tokens"][step]
            entry["reference_token"] = token
            if FORCED in tapset and step < tapset.shape(FORCED)[0]:
                row = np.asarray(tapset.rows(FORCED, step, step + 1)[0], dtype=np.float64)
                entry["candidate_rank"] = int(np.count_nonzero(row > row[token]))
                entry["candidate_token"] = int(np.argmax(row))
        out.append(entry)
    return out
