"""Where a decode-only defect starts: the prefill agrees, and decoding first differs at a step.

When a pair's first divergence is a stage decoding writes (``text.rope_delta``, ``text.cache.*``,
``text.forced.*``, ``text.generate.*``), every stage of the prefill passed, and "no operator introduces the error;
it accumulates from text.generate.margins" would be wrong: the defect is in a decode step. The evidence, each at
its step (``judge.cache.STEPS``: step 0 the prefill, step i the i-th decode call):

- **positions**: ``text.rope_delta`` differs at step i: the decoder placed the token it fed at another position;
- **cache**: the lowest decoder layer whose KV cache breaks the contract, at its earliest position (and head);
- **answer**: the first teacher-forced step whose logits break their top-k tolerance;
- **tokens**: the first free-running token that differs.

The site is the earliest step; at one step a cause comes before its effects (positions, then the cache, then the
answer, then the tokens). Its sentence names the step first, then the layer and position or the position stage.
"""

from __future__ import annotations

import numpy as np

from driftscope.judge.cache import cache_pair
from driftscope.judge.contract import Contract
from driftscope.judge.forced import forced_pair
from driftscope.judge.rows import ComparisonRow, first_divergence
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

DECODE_PREFIXES = ("text.generate", "text.forced", "text.cache", "text.rope_delta")
ORDER = ("positions", "cache", "answer", "tokens")
SAID = {
    "positions": "the decoder's positions",
    "cache": "the KV cache",
    "answer": "the teacher-forced answer",
    "tokens": "the free-running tokens",
}


def is_decode_stage(stage_id: str) -> bool:
    return stage_id.startswith(DECODE_PREFIXES)


def _positions(rows: dict[str, ComparisonRow], reference: TapSet, candidate: TapSet) -> dict | None:
    row = rows.get("text.rope_delta")
    if row is None or row.status != "fail" or "text.rope_delta" not in reference:
        return None
    expected = np.asarray(reference["text.rope_delta"]).reshape(-1)
    actual = np.asarray(candidate["text.rope_delta"]).reshape(-1)
    if expected.shape != actual.shape:
        return {"step": 1, "text": f"the decoder's M-RoPE offsets differ in number ({row.note})"}
    index = int(np.flatnonzero(expected != actual)[0])
    return {
        "step": index + 1,
        "stage": "text.rope_delta",
        "text": f"the decoder places the token it feeds at M-RoPE offset {int(actual[index])} where the reference "
        f"applies {int(expected[index])} (text.rope_delta)",
    }


def _cache(cache: dict | None) -> dict | None:
    if not cache or cache.get("first_layer") is None:
        return None
    kind = str(cache["first_stage"]).rsplit(".", 1)[-1]
    return {
        "step": int(cache["first_step"]),
        "layer": cache["first_layer"],
        "position": cache["first_position"],
        "head": cache["first_head"],
        "stage": cache["first_stage"],
        "text": f"layer {cache['first_layer']}'s KV cache ({kind}) at position {cache['first_position']} (head "
        f"{cache['first_head']})",
    }


def _answer(forced: dict | None) -> dict | None:
    if not forced or forced.get("first_divergence") is None:
        return None
    step = int(forced["first_divergence"])
    return {"step": step, "stage": "text.forced.logits", "text": "the teacher-forced logits (text.forced.logits)"}


def _tokens(reference: TapSet, candidate: TapSet) -> dict | None:
    if "text.generate.tokens" not in reference or "text.generate.tokens" not in candidate:
        return None
    a = np.asarray(reference["text.generate.tokens"]).reshape(-1)
    b = np.asarray(candidate["text.generate.tokens"]).reshape(-1)
    step = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if step is None:
        return None
    return {"step": step, "stage": "text.generate.tokens", "text": f"the free-running token ({b[step]} for {a[step]})"}


def decode_site(
    rows: list[ComparisonRow],
    reference: TapSet,
    candidate: TapSet,
    contract: Contract,
    plan: StagePlan | None = None,
    cache: dict | None = None,
) -> dict | None:
    """The decode step and place a pair first differs at, when its first divergence is a decode stage (None
    otherwise). ``cache``: the pair's ``cache_pair`` when already computed."""
    first = first_divergence(rows)
    if first is None or not is_decode_stage(first.stage):
        return None
    by_stage = {row.stage: row for row in rows}
    cache = cache if cache is not None else cache_pair(reference, candidate, contract, plan)
    found = {
        "positions": _positions(by_stage, reference, candidate),
        "cache": _cache(cache),
        "answer": _answer(forced_pair(reference, candidate, contract)),
        "tokens": _tokens(reference, candidate),
    }
    evidence = {kind: site for kind, site in found.items() if site is not None}
    if not evidence:
        return None
    kind = min(evidence, key=lambda k: (evidence[k]["step"], ORDER.index(k)))
    site = evidence[kind]
    said = (
        f"the prefill agrees; decoding first differs at step {site['step']}"
        if site["step"]
        else "every other prefill stage agrees; the prefill's own KV cache first differs (step 0)"
    )
    text = f"{said}: {site['text']}" + "".join(
        f"; {SAID[other]} from step {entry['step']}" for other, entry in evidence.items() if other != kind
    )
    return {"kind": kind, **site, "text": text, "evidence": evidence, "first_divergence": first.stage}
