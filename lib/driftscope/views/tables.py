"""Text and table views of a report for notebooks and the CLI."""

from __future__ import annotations

from driftscope.capture.runtime_checks import checks_markdown
from driftscope.core.markup import code, format_number, text
from driftscope.run.report import Report

from .notebook import family_text
from .parity import coverage_line, divergence_frame, not_compared_lines, stage_frame  # noqa: F401 - divergence_frame re-exported

block_frame = stage_frame  # failing and first-divergent stages first, then block outputs and landmarks


def _atol_note(first: dict) -> str:
    """Say when the absolute floor decided: every failure is at a reference too small for rtol to matter."""
    failures, bound = int(first.get("failures") or 0), int(first.get("atol_bound_failures") or 0)
    if not failures or first.get("nonfinite_mismatch"):
        return ""
    if bound == failures:
        return f"; all {failures} failures are at near-zero references: atol-bound"
    return f"; {bound} of {failures} failures atol-bound" if bound else ""


def checks_frame(data: dict):
    """Every runtime's checks as a table (runtime, check, status, detail)."""
    import pandas as pd

    checks = (data.get("checks") or {}).items()
    records = [{"runtime": label, **entry} for label, entries in checks for entry in entries]
    return pd.DataFrame(records, columns=["runtime", "check", "status", "detail"])


def summary_markdown(report: Report) -> str:
    """Verdict, first divergence per candidate, drift onset and growth, as Markdown (every value escaped)."""
    data = report.data
    verdict = data.get("verdict", {})
    contract = data.get("contract") or {}
    tolerance = contract.get("default", {})
    lines = [
        f"**Verdict: {text(str(verdict.get('status', 'unknown')).upper())}** for {code(data.get('name'))} "
        f"(commit {code(data.get('commit'))}, reference {code(data.get('reference'))}, contract "
        f"{code(contract.get('name'))}: atol {text(tolerance.get('atol'))}, rtol {text(tolerance.get('rtol'))})",
        "",
    ]
    if report.status != "complete":
        lines.append(f"Run **{text(report.status)}**: {text(report.stopped())}")
        return "\n".join(lines)
    lines += [
        "| runtime pair | verdict | first divergence | failures | max_abs there | drift starts | first 10x growth |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in report.pair_keys():
        first = data.get("first_divergence", {}).get(label)
        growth = data.get("growth", {}).get(label) or []
        where = code(first["stage"], True) if first else "none"
        count = f"{first['failures']}/{first['elements']}" if first else "0"
        worst = _number(first["max_abs"]) if first else ""
        grows = code(growth[0]["stage"], True) if growth else "none"
        onset = data.get("drift_onset", {}).get(label)
        status = verdict.get("per_candidate", {}).get(label)
        lines.append(
            f"| {code(report.pair_title(label), True)} | {text(status)} | {where} | {count} | {worst} | "
            f"{code(onset, True) if onset else 'none'} | {grows} |"
        )
    for label in data.get("checks") or {}:  # a runtime whose capture could not be read has no pair rows
        if label not in report.pair_keys() and label in verdict.get("per_candidate", {}):
            lines.append(f"| {code(label, True)} | {text(verdict['per_candidate'][label])} | | | | | |")
    for label in report.pair_keys():
        worst = worst_element_markdown(report, label)
        lines += [f"\n{code(report.pair_title(label))} at {worst}"] if worst else []
    return "\n".join(lines + details_markdown(report))


def worst_element_markdown(report: Report, label: str) -> str:
    """The pair's first divergence's worst failing (or first non-finite) element with both values; "" for none."""
    first = report.data.get("first_divergence", {}).get(label)
    if not first or first.get("max_coords") is None:
        return ""
    kind = "first non-finite element" if first.get("nonfinite_mismatch") else "worst failing element"
    bound = first.get("tolerance")
    tolerance = "" if bound is None else f" (tolerance {text(_number(bound, 3))})"
    return (
        f"{code(first['stage'])}: {kind} at {code(first['max_coords'])}: "
        f"reference {text(_number(first.get('reference_value'), 6))}, "
        f"candidate {text(_number(first.get('candidate_value'), 6))}{tolerance}" + _atol_note(first)
    )


def details_markdown(report: Report) -> list[str]:
    """What follows the summary's table: narrowing, reasons, warnings, coverage, checks, power, attribution."""
    data, lines = report.data, []
    verdict = data.get("verdict", {})
    lines += narrowing_lines(report)
    for reason in verdict.get("reasons", []):
        lines.append(f"\n- {text(reason)}")
    for warning in data.get("warnings") or []:
        lines.append(f"\n- **warning**: {text(warning)}")
    for name, error in (data.get("pages_failed") or {}).items():
        lines.append(f"\n- **page {text(name)} failed** (the verdict stands): {text(error)}")
    lines += [f"\n- {line}" for line in not_compared_lines(report)]
    coverage = coverage_line(report)
    lines += [f"\n- {coverage}"] if coverage else []
    checks = checks_markdown(data, ("warn",))  # failed checks are among the verdict's reasons above
    if checks:
        lines.append("\n" + checks)
    power = data.get("power")
    if power:
        detected = [m["mutation"] for m in power["mutations"] if m["detected"]]
        blind = [m["mutation"] for m in power["mutations"] if not m["detected"]]
        lines.append(
            f"\n**Fixture power** ({code(power['runtime'])} with each mutation, gate {text(power.get('gate'))}): "
            f"detects {len(detected)}/{len(power['mutations'])}; blind to "
            + (", ".join(code(name) for name in blind) or "nothing")
        )
    attribution = data.get("attribution")
    if attribution:
        lines.append(f"\n**Closer-to attribution**: {text(attribution['verdict'])}")
    for entry in (data.get("linear_replay") or {}).values():
        lines.append(f"\n**Quantized linears, fused and dequantized on the same input**: {text(entry['verdict'])}")
    return lines


def narrowing_lines(report: Report) -> list[str]:
    """Per pair: what narrowing added, the conclusion in words; the peer-relative verdict (Markdown, escaped)."""
    data, lines = report.data, []
    for label in report.pair_keys():
        narrowing = (data.get("narrowing") or {}).get(label)
        for step in (narrowing or {}).get("steps", []):
            done = (
                f"cannot narrow: {text(step['error'])}"
                if "error" in step
                else f"narrowed: captured its {len(step['stages'])} substages on both sides "
                f"(reference: {text(step['reference'])}; candidate: {text(step['candidate'])})"
            )
            lines.append(f"\n{code(report.pair_title(label))} at {code(step['target'])}: {done}")
        conclusion = (data.get("conclusions") or {}).get(label)
        if conclusion:
            lines.append(f"\n**{code(report.pair_title(label))}: {text(conclusion['text'])}**")
    peer = data.get("peer_relative")
    if peer:
        judged = [
            f"{code(label)} {text(entry['status'])}"
            + (f" (first at {code(entry['first_failure'])})" if entry["first_failure"] else "")
            for label, entry in peer["candidates"].items()
        ]
        lines.append(
            f"\n**Relative to the peer {code(peer['peer'])}** (RMSE against {code(peer['reference'])} within the "
            f"contract's peer_factor times the peer's): " + (", ".join(judged) or "no other candidate")
        )
    return lines


def _number(value: object, digits: int = 3) -> str:
    """A metric for display (``core.markup.format_number``); ``None`` (non-finite in JSON) as ``nan``."""
    return format_number(value, digits, missing="nan")


def _margin(mutation: dict) -> str:
    """How far past (or short of) its tolerance a mutation's worst element is, in words."""
    exact = mutation.get("exact_failures")
    if exact:
        return f"exact stage: {exact[0]} of {exact[1]} entries differ"
    margin, stage = mutation.get("margin"), mutation.get("margin_stage")
    if margin is None:
        return "an exact stage differs" if mutation.get("detected") else ""
    where = f" (at {stage})" if stage else ""
    return f"{margin:.3g}x its tolerance{where}" if margin >= 1 else f"{margin:.2g} of its tolerance{where}"


def power_intro(report: Report) -> str:
    """Where the mutations ran (and on what patch, for a port with known defects), the family's examples,
    what is required and the gate."""
    power = report.data.get("power") or {}
    where = f"Mutations run on {code(power.get('runtime'))}"
    if power.get("patched_with"):
        where += (
            f" with {code(power['patched_with'])} applied first: the port's known defects are corrected, and "
            "each mutation plants its defect on a port that agrees with the oracle (some by leaving one fix out)"
        )
    examples = family_text(report, "mutations")
    required = text(", ".join(power.get("require") or []) or "none")
    lines = [where + ".", f"This family's mutations include, for example, {examples}." if examples else ""]
    lines.append(f"Required: {required}; gate: **{text(power.get('gate'))}**")
    return "\n\n".join(line for line in lines if line)


def power_frame(report: Report):
    """The fixture power table: per mutation, detected or not, where, by how much, and why not."""
    import pandas as pd

    power = report.data.get("power") or {}
    required = set(power.get("require", []))
    return pd.DataFrame(
        [
            {
                "mutation": m["mutation"],
                "required": "yes" if m["mutation"] in required else "no",
                "detected": "yes" if m["detected"] else "no",
                "first divergence": m.get("first_divergence") or "",
                "declared stage": m.get("declared_stage") or "",
                "at the declared stage": "yes" if m.get("at_declared_stage") else "no",
                "margin over tolerance": _margin(m),
                "why it is not detected": m.get("blind_reason") or "",
            }
            for m in power.get("mutations", [])
        ]
    )
