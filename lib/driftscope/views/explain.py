"""Notebook 06's explanation of a diverging answer: which side substitution says caused it (the tower's output
or the text side) and whether each candidate's forced-logit error is what half precision costs (three-way)."""

from __future__ import annotations

from driftscope.run.report import Report


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
                "verdict": entry.get("verdict", entry["status"]),
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
    the two error distributions and the verdict (empty when the run had no half-precision runtime)."""
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
            "verdict": entry.get("verdict", entry.get("status")),
        }
        for label, entry in (result.get("candidates") or {}).items()
    ]
    return pd.DataFrame(records)
