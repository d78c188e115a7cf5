"""Answer parity: the greedy tokens of each runtime, where they first differ, the margins there, the texts."""

from __future__ import annotations

import re

import numpy as np

from driftscope.inputs.text_inputs import decode
from driftscope.taps.tapset import TapSet


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
) -> dict:
    """Per runtime: tokens, text, margins, expected words; per pair: the first differing token and its margins."""
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
            "margins": margins,
            "expected_words": _words(text, expect),
            "prefill_top1": None if logits is None else int(np.argmax(logits)),
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
            }
        )
    return {"reference": reference, "expect": expect, "runtimes": runtimes, "pairs": comparisons}
