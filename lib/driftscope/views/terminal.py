"""A report as plain text for a terminal (``driftscope show`` and ``rejudge`` there): the verdict, then per runtime
pair its first divergence and worst element, the suspected cause, the family's ready patch and the worst token
row followed back through the tower (the lineage); then what the Markdown summary says after its table, with no
Markdown punctuation or escapes left."""

from __future__ import annotations

import html
import re
import sys

from driftscope.run.report import Report

from .cause import cause_text, patch_text
from .tables import _number, details_markdown, worst_element_markdown

_CODE = re.compile(r"(?<![\\`])(`+)(?!`) ?(.*?) ?(?<!`)\1(?!`)")
_ESCAPED = re.compile(r"\\([\\`*_\[\]|~])")


def plain(markdown: str) -> str:
    """Markdown the views wrote (emphasis, code spans, escaped punctuation, HTML entities) as the text it shows."""
    text = _CODE.sub(lambda m: m.group(2).replace("\\|", "|"), markdown)
    text = _ESCAPED.sub(r"\1", text.replace("**", ""))
    return html.unescape(text)


def lineage_text(report: Report, label: str, shown: int = 6) -> str:
    """The first divergence's worst token row back through the tower: each stage's share of its tolerance."""
    lineage = (report.data.get("lineage") or {}).get(label)
    if not lineage or not lineage.get("stages"):
        return ""
    stages = lineage["stages"]
    picked = stages if len(stages) <= shown else [*stages[: shown // 2], None, *stages[-(shown - shown // 2) :]]
    steps = ["..." if entry is None else f"{entry['stage']} {_number(entry['max_excess'], 2)}" for entry in picked]
    at = ", ".join(f"{axis} {index}" for axis, index in (lineage.get("row_at") or {}).items())
    where = f"{lineage['unit']} row {lineage['raster_row']} ({at + '; ' if at else ''}raster order)"
    return f"{where}, tolerance used per stage: " + " -> ".join(steps)


def summary(report: Report, form: str = "auto") -> str:
    """The summary ``show`` and ``rejudge`` print: plain ``text`` (``auto``: when printing to a terminal) or
    ``markdown``."""
    if form == "text" or (form == "auto" and sys.stdout.isatty()):
        return summary_text(report)
    from .tables import summary_markdown

    return summary_markdown(report)


def summary_text(report: Report) -> str:
    """The report's summary as terminal text."""
    data = report.data
    verdict, contract = data.get("verdict") or {}, data.get("contract") or {}
    tolerance = contract.get("default") or {}
    lines = [
        f"{data.get('name')}: {str(verdict.get('status', 'unknown')).upper()}  (commit {data.get('commit')}, "
        f"reference {data.get('reference')}, contract {contract.get('name')}: atol {tolerance.get('atol')}, "
        f"rtol {tolerance.get('rtol')})"
    ]
    if report.status != "complete":
        return "\n".join([*lines, f"run {report.status}: {report.stopped()}"])
    for label in report.pair_keys():
        first = (data.get("first_divergence") or {}).get(label)
        growth = (data.get("growth") or {}).get(label) or []
        onset = (data.get("drift_onset") or {}).get(label)
        fields = [
            (
                "first divergence",
                f"{first['stage']}: {first['failures']}/{first['elements']} elements over tolerance, "
                f"max |a - e| {_number(first['max_abs'])}"
                if first
                else "none",
            ),
            ("worst element", plain(worst_element_markdown(report, label)).partition(" element at ")[2]),
            ("drift", f"starts at {onset or 'none'}; first 10x growth at {growth[0]['stage'] if growth else 'none'}"),
            ("suspected cause", cause_text(report, label)),
            ("ready patch", patch_text(report, label)),
            ("lineage", lineage_text(report, label)),
        ]
        status = (verdict.get("per_candidate") or {}).get(label)
        lines += ["", f"{report.pair_title(label)}: {status}"]
        lines += [f"  {name:<16} {value}" for name, value in fields if value and (first or name == "drift")]
    details = [plain(line).strip() for line in details_markdown(report)]
    return "\n".join([*lines, "", *[line for line in details if line]])
