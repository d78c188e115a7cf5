"""The reviewers' evidence index (one static, self-contained HTML page per commit) and JUnit XML."""

from __future__ import annotations

import base64
import html
import io
import time
from pathlib import Path
from xml.etree import ElementTree

from ..atomic import write_text_atomic

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;width:100%}
th,td{border:1px solid #ccc;padding:6px 8px;vertical-align:top;font-size:14px}
th{background:#f3f3f3;text-align:left}
.pass{background:#e3f5e1}.fail{background:#f8d0d0}.error{background:#fde8b0}
code{font-size:13px}img{display:block}
"""


def _curve_png(report) -> str:
    """A small error-curve image (max_abs per stage, one line per pair) as a data URI."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from .plots import error_curves

    figure = error_curves(report, metrics=("max_abs",))
    figure.set_size_inches(6.5, 2.3)
    for axis in figure.axes:
        axis.set_title("")
        legend = axis.get_legend()
        if legend:
            legend.remove()
        axis.set_xticks([])
        axis.set_xlabel("")
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _worst(report) -> str:
    rows = [r for r in report.rows if not r.integer and r.status in ("pass", "fail")]
    if not rows:
        return ""
    worst = max(rows, key=lambda r: r.max_abs / max(r.atol + r.rtol * abs(r.max_reference_value or 0.0), 1e-30))
    return f"{worst.stage} ({worst.pair or worst.candidate}, max_abs {worst.max_abs:.3g})"


def index_rows(directory: Path, summaries: list[dict]) -> list[dict]:
    from ..report import Report

    rows = []
    for summary in summaries:
        out = Path(summary.get("out", ""))
        row = {
            "name": summary.get("name") or Path(summary["params"]).stem,
            "verdict": summary["verdict"],
            "status": summary["status"],
            "error": summary.get("error"),
            "first": "",
            "worst": "",
            "runtimes": "",
            "curve": None,
            "links": [],
        }
        report_path = out / "report.json"
        if report_path.exists():
            report = Report.load(report_path)
            firsts = [
                f"{key}: {value['stage']}"
                for key, value in (report.data.get("first_divergence") or {}).items()
                if value
            ]
            row["first"] = "; ".join(firsts) or "none"
            row["worst"] = _worst(report)
            row["runtimes"] = ", ".join(r["label"] for r in report.data.get("runtimes", []))
            if report.data.get("rows"):
                row["curve"] = _curve_png(report)
            if report.data.get("status") != "complete":
                row["error"] = row["error"] or f"stopped at {report.data.get('stopped_at')}"
        for page in sorted(out.glob("*.html")) if out.exists() else []:
            row["links"].append((f"{out.name}/{page.name}", page.name))
        rows.append(row)
    return rows


def write_index(directory: Path, summaries: list[dict]) -> Path:
    """``directory/index.html``: verdict, first divergence, worst stage, runtimes, a curve and links per run."""
    rows = index_rows(directory, summaries)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("pass", "fail", "error")}
    body = [
        f"<h1>driftscope evidence: commit <code>{html.escape(directory.name)}</code></h1>",
        f"<p>{len(rows)} run(s): {counts['pass']} pass, {counts['fail']} fail, {counts['error']} could not run. "
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>",
        "<table><tr><th>run</th><th>verdict</th><th>first divergence</th><th>worst stage</th><th>runtimes</th>"
        "<th>error per stage</th><th>rendered</th></tr>",
    ]
    for row in rows:
        verdict = row["verdict"] if row["verdict"] in ("pass", "fail") else "error"
        curve = (
            f'<img src="{row["curve"]}" alt="max_abs per stage for {html.escape(row["name"])}" width="390">'
            if row["curve"]
            else ""
        )
        links = "<br>".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a>' for href, text in row["links"])
        error = f"<br><small>{html.escape(str(row['error']))}</small>" if row["error"] else ""
        body.append(
            f'<tr class="{verdict}"><td><b>{html.escape(row["name"])}</b></td><td>{html.escape(row["verdict"])}'
            f"{error}</td><td><code>{html.escape(row['first'])}</code></td><td><code>{html.escape(row['worst'])}"
            f"</code></td><td>{html.escape(row['runtimes'])}</td><td>{curve}</td><td>{links}</td></tr>"
        )
    body.append("</table>")
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>driftscope {directory.name}'
        f"</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>"
    )
    target = directory / "index.html"
    write_text_atomic(target, page)
    return target


def write_junit(path: Path, summaries: list[dict]) -> Path:
    """One test case per run: a failing verdict is a failure, a run that could not execute an error."""
    suite = ElementTree.Element(
        "testsuite",
        name="driftscope",
        tests=str(len(summaries)),
        failures=str(sum(s["verdict"] == "fail" and not s.get("error") for s in summaries)),
        errors=str(sum(bool(s.get("error")) or s["status"] != "complete" for s in summaries)),
    )
    for summary in summaries:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=f"driftscope.{summary['commit']}",
            name=summary.get("name") or Path(summary["params"]).stem,
            time=str(summary.get("seconds", 0)),
        )
        if summary.get("error") or summary["status"] != "complete":
            ElementTree.SubElement(case, "error", message=str(summary.get("error") or summary["status"]))
        elif summary["verdict"] != "pass":
            ElementTree.SubElement(
                case, "failure", message=f"verdict {summary['verdict']}"
            ).text = f"see {summary.get('out')}/report.json"
    write_text_atomic(path, ElementTree.tostring(suite, encoding="unicode", xml_declaration=True))
    return path
