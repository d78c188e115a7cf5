"""Text and table views of a report for notebooks and the CLI."""

from __future__ import annotations

from ..report import Report


def summary_markdown(report: Report) -> str:
    """Verdict, first divergence per candidate, drift onset and growth, as Markdown."""
    data = report.data
    verdict = data.get("verdict", {})
    lines = [
        f"**Verdict: {verdict.get('status', 'unknown').upper()}** for `{data.get('name')}` "
        f"(commit `{data.get('commit')}`, reference `{data.get('reference')}`, contract "
        f"`{data.get('contract', {}).get('name')}`: atol {data.get('contract', {}).get('default', {}).get('atol')}, "
        f"rtol {data.get('contract', {}).get('default', {}).get('rtol')})",
        "",
    ]
    if data.get("status") != "complete":
        error = data.get("error") or {}
        lines.append(f"Run **{data.get('status')}**, stopped at `{data.get('stopped_at')}`: {error.get('message', '')}")
        return "\n".join(lines)
    lines += [
        "| runtime pair | verdict | first divergence | failures | max_abs there | drift starts | first 10x growth |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in report.pair_keys():
        first = data.get("first_divergence", {}).get(label)
        growth = data.get("growth", {}).get(label) or []
        where = f"`{first['stage']}`" if first else "none"
        count = f"{first['failures']}/{first['elements']}" if first else "0"
        worst = f"{first['max_abs']:.3g}" if first else ""
        grows = f"`{growth[0]['stage']}`" if growth else "none"
        onset = data.get("drift_onset", {}).get(label)
        status = verdict.get("per_candidate", {}).get(label)
        lines.append(
            f"| `{report.pair_title(label)}` | {status} | {where} | {count} | {worst} | "
            f"{'`' + onset + '`' if onset else 'none'} | {grows} |"
        )
    for reason in verdict.get("reasons", []):
        lines.append(f"\n- {reason}")
    power = data.get("power")
    if power:
        detected = [m["mutation"] for m in power["mutations"] if m["detected"]]
        blind = [m["mutation"] for m in power["mutations"] if not m["detected"]]
        lines.append(
            f"\n**Fixture power** ({power['runtime']} with each mutation, gate {power.get('gate')}): "
            f"detects {len(detected)}/{len(power['mutations'])}; blind to "
            + (", ".join(f"`{name}`" for name in blind) or "nothing")
        )
    return "\n".join(lines)


def power_frame(report: Report):
    """The fixture power table: per mutation, detected or not, where, and why not."""
    import pandas as pd

    power = report.data.get("power") or {}
    columns = [
        "mutation",
        "detected",
        "first_divergence",
        "declared_stage",
        "at_declared_stage",
        "margin",
        "blind_reason",
    ]
    required = set(power.get("require", []))
    frame = pd.DataFrame([{k: m[k] for k in columns} for m in power.get("mutations", [])], columns=columns)
    frame.insert(1, "required", frame["mutation"].isin(required))
    return frame


def divergence_frame(report: Report):
    """For each runtime pair, the first divergent stage's row with both values at the worst element."""
    import pandas as pd

    records = []
    first = report.data.get("first_divergence", {})
    for row in report.rows:
        divergence = first.get(row.pair or row.candidate)
        if divergence and divergence["stage"] == row.stage:
            records.append(
                {
                    "pair": report.pair_title(row.pair or row.candidate),
                    "stage": row.stage,
                    "status": row.status,
                    "failures": row.failures,
                    "elements": row.elements,
                    "max_abs": row.max_abs,
                    "rms": row.rms,
                    "cosine": row.cosine,
                    "worst at": row.max_coords,
                    "reference value": row.max_reference_value,
                    "candidate value": row.max_candidate_value,
                    "note": row.note,
                }
            )
    return pd.DataFrame(records)


def block_frame(report: Report):
    """Rows of block outputs, the plan's landmarks (and their parts) and any failing stage: the compact table."""
    from .plots import block_outputs, landmarks

    frame = report.frame()
    if frame.empty:
        return frame
    marks = landmarks(report)
    keep = (
        frame["stage"].isin(block_outputs(report))
        | frame["stage"].map(lambda stage: any(stage == m or stage.startswith(m + ".") for m in marks))
        | (frame["status"] != "pass")
    )
    return frame[keep].reset_index(drop=True)
