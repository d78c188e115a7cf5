"""Notebook 06's explanation of a diverging answer: which side substitution says caused it (the tower's output
or the text side) and whether each candidate's forced-logit and KV-cache errors are what half precision costs
(three-way)."""

from __future__ import annotations

from driftscope.run.report import Report

#: the substitution's verdicts and statuses as a reader says them
VERDICTS = {
    "tower": "the tower's output",
    "text": "the text side",
    "both": "both sides",
    "neither": "neither side alone",
    "not_needed": "not needed",
    "unavailable": "unavailable",
}


#: flips spelled out per candidate line (the rest are counted; the table below lists every one)
SHOWN_FLIPS = 3


def _g(value: float) -> str:
    return f"{value:.3g}"


def _forced_said(forced: dict) -> str:
    first = forced.get("first_divergence")
    if first is None:
        said = f"teacher-forced, the answer agrees at all {forced.get('steps_compared')} steps"
    else:
        by = ", ".join(key.rsplit(".", 1)[1] for key in forced.get("first_divergence_by") or [])
        said = f"teacher-forced, the answer first diverges at step {first} ({by})"
    flips = forced.get("flips") or []
    if not flips:
        return said + "; no flip of the top-1 token"
    each = ", ".join(
        f"step {f['step']} {f['label']} (reference margin {_g(f['reference_margin'])}, allowed {_g(f['allowed'])})"
        for f in flips[:SHOWN_FLIPS]
    )
    more = f", and {len(flips) - SHOWN_FLIPS} more" if len(flips) > SHOWN_FLIPS else ""
    confident = sum(1 for f in flips if f["label"] == "confident")
    counts = (
        f"{len(flips)} flip{'s' if len(flips) != 1 else ''} ({confident} confident, {len(flips) - confident} near-tie)"
    )
    return f"{said}; {counts}: {each}{more}"


def _cache_said(cache: dict | None) -> str:
    if not cache:
        return "the KV cache was not compared"
    if cache.get("first_layer") is None:
        return "every layer's KV cache agrees"
    where = "in the prefill (step 0)" if not cache.get("first_step") else f"at step {cache['first_step']}"
    kind = str(cache.get("first_stage") or "").rsplit(".", 1)[-1]
    return f"layer {cache['first_layer']}'s KV cache first differs {where} (head {cache['first_head']}, {kind})"


def _substitution_said(entry: dict | None) -> str:
    if not entry:
        return ""
    verdict = entry.get("verdict")
    if verdict in ("tower", "text", "both", "neither"):
        return f"substitution: {VERDICTS[verdict]} {'explain' if verdict == 'both' else 'explains'} it"
    if entry.get("status") == "not_needed":
        return "substitution not needed"
    return f"substitution {VERDICTS.get(entry.get('status'), entry.get('status'))}: {entry.get('text', '')}"


def answer_sentences(report: Report) -> list[str]:
    """One markdown line per pair that decoded teacher-forced: where its answer first diverges, each flip with
    its label, which layer's cache first differs, which side substitution blames, and the three-way verdict."""
    answer = report.data.get("answer") or {}
    three_way = (answer.get("three_way") or {}).get("candidates") or {}
    lines = []
    for pair in answer.get("pairs", []):
        forced = pair.get("forced")
        if not forced:
            continue
        parts = [_forced_said(forced)]
        first = pair.get("first_difference")
        parts.append(
            "free-running tokens identical"
            if first is None
            else f"free-running, the first token differs at step {first}"
        )
        parts.append(_cache_said(pair.get("cache")))
        parts.append(_substitution_said(pair.get("substitution")))
        peer = three_way.get(pair["candidate"]) if pair["reference"] == answer.get("reference") else None
        if pair["candidate"] == (answer.get("three_way") or {}).get("peer") and pair["reference"] == answer.get(
            "reference"
        ):
            parts.append("three-way: the half-precision peer the other candidates are set against")
        elif peer and peer.get("text"):
            cache = (peer.get("cache") or {}).get("text")
            parts.append(f"three-way: {peer['text']}" + (f", and {cache}" if cache else ""))
        lines.append(f"- **{pair['candidate']} vs {pair['reference']}**: " + "; ".join(p for p in parts if p) + ".")
    return lines


def substitution_frame(report: Report):
    """One row per pair: the substitution's verdict and what each substituted run did (first divergence, flips)."""
    import pandas as pd

    records = []
    for pair in (report.data.get("answer") or {}).get("pairs", []):
        entry = pair.get("substitution")
        if not entry:
            continue
        a = entry.get("candidate_text_on_reference_tower") or {}
        b = entry.get("reference_text_on_candidate_tower") or {}
        records.append(
            {
                "pair": f"{pair['candidate']} vs {pair['reference']}",
                "verdict": VERDICTS.get(entry.get("verdict", entry["status"]), entry.get("verdict", entry["status"])),
                "candidate's text side, reference's tower": _run(a),
                "reference's text side, candidate's tower": _run(b),
                "explanation": entry["text"],
            }
        )
    return pd.DataFrame(records)


def _run(summary: dict) -> str:
    if not summary:
        return "not run"
    first = summary.get("first_divergence")
    return ("agrees" if first is None else f"diverges at step {first}") + f", {summary.get('flips', 0)} flip(s)"


def three_way_frame(report: Report):
    """One row per candidate: its forced-logit error RMS, the half-precision peer's, their ratio, the overlap of
    the two error distributions and the verdict, then the same for the KV cache (empty when the run had no
    half-precision runtime)."""
    import pandas as pd

    result = (report.data.get("answer") or {}).get("three_way") or {}
    records = [
        {
            "candidate": label,
            "peer": result["peer"],
            "error RMS": entry.get("candidate_rmse"),
            "peer's error RMS": entry.get("peer_rmse"),
            "ratio": entry.get("ratio"),
            "overlap": entry.get("overlap"),
            "verdict": _within(entry.get("verdict", entry.get("status")), result.get("peer_dtype")),
            "KV cache error RMS": (entry.get("cache") or {}).get("candidate_rmse"),
            "peer's KV cache error RMS": (entry.get("cache") or {}).get("peer_rmse"),
            "KV cache verdict": _cache_verdict(entry.get("cache"), result.get("peer_dtype")),
        }
        for label, entry in (result.get("candidates") or {}).items()
    ]
    return pd.DataFrame(records)


def _within(verdict, dtype: str | None) -> str:
    """The three-way verdict as said of a candidate that may compute in float32: its error is within what the
    peer's half precision costs (never "half-precision", which would name the candidate's own dtype)."""
    return f"within what {dtype or 'half precision'} costs" if verdict == "half-precision" else str(verdict)


def _cache_verdict(cache: dict | None, dtype: str | None = None) -> str:
    if not cache:
        return "not compared"
    if cache.get("first_layer") is None:
        return _within(cache.get("verdict"), dtype)
    return f"{cache.get('verdict')} from layer {cache['first_layer']}"


def three_way_note(report: Report) -> str:
    """Why the three-way table is empty, when it is (``""``: it has rows)."""
    result = (report.data.get("answer") or {}).get("three_way") or {}
    if result.get("candidates"):
        return ""
    return "This run has no half-precision runtime (bf16 or f16) to compare with: no three-way verdict."
