"""Notebook 06's first screen: per candidate one line, "same answer" or "differs at step s (near-tie or
confident) because ...", before any table.

The step is where the teacher-forced decode first flips the top-1 token (both runtimes asked the same question),
else where the free-running tokens first differ; its label is the flip's (**near-tie**: the reference's margin is
within the error the candidate's policy allows there, rounding decides it; **confident**: beyond it, a defect). The
"because" is the strongest evidence the run holds, in this order: the pair's decode-only conclusion (a cache layer
or a position stage), the substitution (the tower's output or the text side), the first decoder layer whose KV
cache differs, the tower's own first divergence, the three-way verdict against a half-precision peer.
"""

from __future__ import annotations

from driftscope.core.markup import code, text
from driftscope.run.report import Report

from .explain import VERDICTS


def _g(value) -> str:
    return "?" if value is None else f"{value:.3g}"


def _step(pair: dict) -> tuple[int | None, dict | None]:
    """The step at which the answer first differs and its flip (None: the tokens never differ)."""
    flips = (pair.get("forced") or {}).get("flips") or []
    if flips:
        return flips[0]["step"], flips[0]
    return pair.get("first_difference"), None


def _label(flip: dict | None) -> str:
    if flip is None:
        return "not decoded teacher-forced there"
    margin, allowed = flip.get("reference_margin"), flip.get("allowed")
    if flip["label"] == "near-tie":
        return f"near-tie: the reference's margin {_g(margin)} is within the {_g(allowed)} its policy allows"
    return f"confident: the reference's margin {_g(margin)} is beyond the {_g(allowed)} its policy allows"


def _vision(report: Report, key: str) -> str | None:
    failing = [r.stage for r in report.rows if (r.pair or r.candidate) == key and r.failed]
    return next((stage for stage in failing if not stage.startswith("text.")), None)


def _because(report: Report, key: str, pair: dict, flip: dict | None) -> str:
    conclusion = report.conclusion(key)
    if conclusion.get("kind") == "decode":
        return text(conclusion.get("text", ""))
    verdict = (pair.get("substitution") or {}).get("verdict")
    if verdict in ("tower", "text", "both"):
        return f"substitution says {VERDICTS[verdict]} {'explain' if verdict == 'both' else 'explains'} it"
    cache = pair.get("cache") or {}
    if cache.get("first_layer") is not None:
        where = "in the prefill" if not cache.get("first_step") else f"at step {cache['first_step']}"
        return f"decoder layer {cache['first_layer']}'s KV cache first differs {where}"
    vision = _vision(report, key)
    if vision:
        return f"its tower first diverges at {code(vision)}"
    if flip is not None and flip["label"] == "near-tie":
        return "nothing upstream breaks the contract: the policy's rounding decides a near-tie"
    return "no stage before it breaks the contract"


def _three_way(report: Report, pair: dict) -> str:
    three = _answer(report).get("three_way") or {}
    if pair["candidate"] == three.get("peer") and pair["reference"] == _answer(report).get("reference"):
        return "; the half-precision peer the other candidates are set against"
    entry = (three.get("candidates") or {}).get(pair["candidate"])
    if not entry or pair["reference"] != _answer(report).get("reference") or "ratio" not in entry:
        return ""
    dtype = three.get("peer_dtype") or "half precision"
    if entry.get("verdict") == "half-precision":
        return f"; its forced-logit error is within what {dtype} costs ({three['peer']}: ratio {_g(entry['ratio'])})"
    return f"; its forced-logit error is {_g(entry['ratio'])}x {three['peer']}'s: more than {dtype} costs"


def _answer(report: Report) -> dict:
    return report.data.get("answer") or {}


def headline_lines(report: Report) -> list[str]:
    """One Markdown line per pair that decoded: same answer, or where it differs, its label and why."""
    from driftscope.judge.verdict import pair_key

    answer = _answer(report)
    lines = []
    for pair in answer.get("pairs", []):
        key = pair_key(pair["reference"], pair["candidate"], answer.get("reference") or report.data.get("reference"))
        who = f"**{text(pair['candidate'])} vs {text(pair['reference'])}**"
        step, flip = _step(pair)
        forced = pair.get("forced") or {}
        if step is None:
            tokens = ((answer.get("runtimes") or {}).get(pair["candidate"]) or {}).get("tokens") or []
            steps = forced.get("steps_compared") or len(tokens)
            broke = forced.get("first_divergence")
            detail = (
                "every teacher-forced step within the contract"
                if broke is None
                else f"its teacher-forced logits break the top-k tolerance from step {broke}, with no flip"
            )
            lines.append(f"- {who}: **same answer** ({steps} tokens; {detail}){_three_way(report, pair)}.")
            continue
        said = f"**differs at step {step}** ({_label(flip)}) because {_because(report, key, pair, flip)}"
        lines.append(f"- {who}: {said}{_three_way(report, pair)}.")
    return lines
