"""The reviewers' evidence index (one static, self-contained HTML page per commit) and JUnit XML.

Both list every run of the commit under the output root (see :func:`driftscope.run.runrecord.commit_entries`),
classified by :func:`driftscope.run.runrecord.outcome`, the same rule the exit code follows.
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from pathlib import Path
from xml.etree import ElementTree

from driftscope.core.names import url_path
from driftscope.run.runrecord import counts, exit_code, outcome

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #ccc;padding:6px 8px;vertical-align:top;font-size:14px}
th{background:#f3f3f3;text-align:left}
.pass{background:#e3f5e1}.fail{background:#f8d0d0}.error{background:#fde8b0}.running{background:#e8eefc}
code{font-size:13px}img{display:block}
"""


def _curve_png(report) -> str:
    """A small error-curve image (share of its tolerance each stage uses, one line per pair) as a data URI."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from driftscope.views.plots import error_curves

    figure = error_curves(report, metrics=("tolerance_used",))
    figure.set_size_inches(6.5, 2.3)
    figure.suptitle("")
    for axis in figure.axes:
        axis.set_title("")
        legend = axis.get_legend()
        if legend:
            legend.remove()
        axis.set_xticks([])
        axis.set_xlabel("")
        axis.set_ylabel("tolerance used", fontsize=8)
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def worst_stage(rows) -> tuple[object, str] | None:
    """The worst failing stage (largest excess over its tolerance) when one fails, else the closest to failing.

    Returns (row, how bad) or None; integer stages and stages nobody judged are left out.
    """
    judged = [r for r in rows if not r.integer and r.status in ("pass", "fail")]
    if not judged:
        return None

    def ratio(r) -> float:  # |a - e| at the largest difference, over that element's tolerance
        return r.max_abs / max(r.atol + r.rtol * abs(r.max_reference_value or 0.0), 1e-30)

    failing = [r for r in judged if r.status == "fail"]
    if failing:
        worst = max(failing, key=lambda r: (math.inf if r.max_excess is None else r.max_excess, ratio(r)))
        excess = "non-finite" if worst.max_excess is None else f"{worst.max_excess:.3g}x its tolerance"
        return worst, f"{excess}, {worst.failures}/{worst.elements} over"
    worst = max(judged, key=ratio)
    return worst, f"max_abs {worst.max_abs:.3g}, {ratio(worst):.2f} of its tolerance"


def _worst(report) -> str:
    found = worst_stage(report.rows)
    if found is None:
        return ""
    row, how = found
    return f"{row.stage} ({row.pair or row.candidate}, {how})"


def index_rows(root, commit: str, entries: list[dict]) -> list[dict]:
    """One row per run of the commit: its outcome, and what its report says when the entry judged one."""
    from driftscope.run.report import Report

    rows = []
    for entry in entries:
        row = {
            "name": entry["name"],
            "outcome": outcome(entry),
            "verdict": entry.get("verdict") or "unknown",
            "error": entry.get("error"),
            "reused": bool(entry.get("reused")),
            "first": "",
            "worst": "",
            "runtimes": "",
            "curve": None,
            "links": [],
        }
        data = entry.get("report")
        if data:
            report = Report(Path(entry["dir"]) / "report.json", data)
            firsts = [
                f"{key}: {value['stage']}" for key, value in (data.get("first_divergence") or {}).items() if value
            ]
            row["first"] = "; ".join(firsts) or "none"
            row["worst"] = _worst(report)
            row["runtimes"] = ", ".join(r["label"] for r in data.get("runtimes", []))
            if data.get("rows"):
                row["curve"] = _curve_png(report)
            pages = [name for name in root.files(commit, entry["dir"]) if name.endswith(".html")]
            row["links"] = [(url_path(entry["dir"], name), name) for name in pages]
        rows.append(row)
    return rows


def headline(entries: list[dict]) -> str:
    """The counts the gate decides on, and its exit code."""
    found = counts(entries)
    unknown = sum(
        e.get("status") == "complete" and not e.get("error") and e.get("verdict") not in ("pass", "fail")
        for e in entries
    )
    text = (
        f"{len(entries)} run(s): {found['pass']} pass, {found['fail']} fail, {found['error']} could not run"
        + (f" ({unknown} with verdict unknown)" if unknown else "")
        + (f", {found['running']} still running elsewhere" if found["running"] else "")
    )
    return f"{text}; exit code {exit_code(entries)}"


def write_index(root, commit: str, entries: list[dict], problem: str | None = None) -> str:
    """``<root>/<commit>/index.html``: every run of the commit with its verdict, first divergence, worst stage,
    runtimes, a curve and links; the headline counts are the gate's (and its exit code)."""
    rows = index_rows(root, commit, entries)
    body = [
        f"<h1>driftscope evidence: commit <code>{html.escape(commit)}</code></h1>",
        f"<p>{html.escape(headline(entries))}. Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>",
    ]
    if problem:
        body.append(f'<p class="error"><b>The batch did not finish:</b> {html.escape(problem)}</p>')
    body.append(
        "<table><tr><th>run</th><th>verdict</th><th>first divergence</th><th>worst stage</th><th>runtimes</th>"
        "<th>error per stage</th><th>rendered</th></tr>"
    )
    for row in rows:
        label = {"error": "could not run", "running": "running"}.get(row["outcome"], row["outcome"])
        if row["outcome"] == "error" and not row["error"]:
            label = f"not judged (verdict {row['verdict']})"
        curve = (
            f'<img src="{row["curve"]}" alt="tolerance used per stage, {html.escape(row["name"])}" width="390">'
            if row["curve"]
            else ""
        )
        links = "<br>".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a>' for href, text in row["links"])
        error = f"<br><small>{html.escape(str(row['error']))}</small>" if row["error"] else ""
        reused = " <small>(reused)</small>" if row["reused"] else ""
        body.append(
            f'<tr class="{row["outcome"]}"><td><b>{html.escape(row["name"])}</b></td><td>{html.escape(label)}'
            f"{reused}{error}</td><td><code>{html.escape(row['first'])}</code></td><td><code>"
            f"{html.escape(row['worst'])}</code></td><td>{html.escape(row['runtimes'])}</td><td>{curve}</td>"
            f"<td>{links}</td></tr>"
        )
    body.append("</table>")
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>driftscope {html.escape(commit)}'
        f"</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>"
    )
    return root.write_text(commit, "index.html", text=page)


def write_junit(root, commit: str, entries: list[dict]) -> str:
    """``<root>/<commit>/junit.xml``: one test case per run (classname and name: the run's name), a failing
    verdict a failure carrying its reasons, a run that could not run (or was not judged) an error."""
    found = counts(entries)
    suite = ElementTree.Element(
        "testsuite",
        name="driftscope",
        tests=str(len(entries)),
        failures=str(found["fail"]),
        errors=str(found["error"] + found["running"]),
        time=f"{sum(float(e.get('seconds') or 0.0) for e in entries):.2f}",
    )
    properties = ElementTree.SubElement(suite, "properties")
    ElementTree.SubElement(properties, "property", name="commit", value=commit)
    for entry in entries:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=entry["name"],
            name=entry["name"],
            time=f"{float(entry.get('seconds') or 0.0):.2f}",
        )
        properties = ElementTree.SubElement(case, "properties")
        for key, value in (
            ("commit", commit),
            ("parameters", entry.get("params")),
            ("reused", "true" if entry.get("reused") else "false"),
            ("host", entry.get("host")),
        ):
            if value is not None:
                ElementTree.SubElement(properties, "property", name=key, value=str(value))
        state = outcome(entry)
        reasons = [str(r) for r in entry.get("reasons") or []]
        if state in ("error", "running"):
            message = entry.get("error") or (
                "still running" if state == "running" else f"verdict {entry.get('verdict')}: not judged"
            )
            ElementTree.SubElement(case, "error", message=str(message)).text = "\n".join([str(message), *reasons])
        elif state == "fail":
            failure = ElementTree.SubElement(case, "failure", message="; ".join(reasons) or "verdict fail")
            where = f"{entry['dir']}/report.json" if entry.get("dir") else "report.json"
            failure.text = "\n".join([*reasons, f"see {where}"])
    ElementTree.indent(suite)
    return root.write_text(
        commit, "junit.xml", text=ElementTree.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
    )
