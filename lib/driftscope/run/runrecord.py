"""What a run of a batch left: its record (``run.json``), its outcome for the gate, and dead runs marked so.

A run directory ``<root>/<commit>/<run>/`` holds ``report.json`` (written by the investigation) and
``run.json`` (written when the batch's attempt ended: its status, verdict, error and duration). The
newest of the two says what the run's result is; :func:`outcome` maps it to pass / fail / error, the
one classification the index, the JUnit XML and the exit code all use.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from driftscope.core.atomic import write_json_atomic

RECORD = "run.json"
OUTCOMES = ("pass", "fail", "error")


def now() -> str:
    """A UTC time stamp in the report's format (sortable as text)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def from_report(data: dict) -> dict:
    """Status, verdict, reasons and error of a report's JSON (what a summary needs from it)."""
    verdict = data.get("verdict") if isinstance(data.get("verdict"), dict) else {}
    error = data.get("error") if isinstance(data.get("error"), dict) else None
    status = str(data.get("status") or "unknown")
    out = {
        "status": status,
        "verdict": str(verdict.get("status") or "unknown"),
        "reasons": [str(r) for r in verdict.get("reasons") or []],
        "stopped_at": data.get("stopped_at"),
        "report_updated": data.get("updated"),
        "error": None,
    }
    if status != "complete":
        cause = f"{error.get('type')}: {error.get('message')}" if error else f"report status {status!r}"
        out["error"] = f"stopped at {data.get('stopped_at')}: {cause}"
    return out


def duration(data: dict) -> float:
    """Seconds between a report's creation and its last update (the run's length when no record says)."""
    try:
        created = time.strptime(str(data["created"]), "%Y-%m-%dT%H:%M:%SZ")
        updated = time.strptime(str(data["updated"]), "%Y-%m-%dT%H:%M:%SZ")
    except (KeyError, ValueError):
        return 0.0
    return max(0.0, time.mktime(updated) - time.mktime(created))


def outcome(entry: dict) -> str:
    """``pass``, ``fail`` or ``error`` (could not run, or a verdict nobody could judge: ``unknown``)."""
    if entry.get("status") == "running" and not entry.get("error"):  # a run with an error is not running any more
        return "running"
    if entry.get("error") or entry.get("status") != "complete":
        return "error"
    return entry["verdict"] if entry.get("verdict") in ("pass", "fail") else "error"


def counts(entries: list[dict]) -> dict[str, int]:
    """How many entries have each outcome (``running``: in progress elsewhere, not a result yet)."""
    found = {key: 0 for key in (*OUTCOMES, "running")}
    for entry in entries:
        found[outcome(entry)] += 1
    return found


def exit_code(entries: list[dict]) -> int:
    """The gate: 2 when a run could not run or was not judged, else 1 when a verdict fails, else 0."""
    found = counts(entries)
    return 2 if found["error"] else 1 if found["fail"] else 0


def mark_dead(out: Path, reason: str) -> bool:
    """Mark ``out``'s report dead if it still says ``running`` and no process holds the run's lock."""
    from driftscope.errors import DriftscopeError
    from driftscope.run.runlock import run_lock

    path = Path(out) / "report.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if data.get("status") != "running":
        return False
    try:
        with run_lock(Path(out)):
            data.update(
                status="error",
                error={"type": "RunLost", "message": reason},
                verdict={"status": "error", "reasons": [f"stopped at {data.get('stopped_at')}: {reason}"]},
                updated=now(),
            )
            write_json_atomic(path, data)
    except DriftscopeError:  # the lock is held: the run is alive
        return False
    return True


def _alive(out: Path) -> bool:
    """Whether a process holds the run directory's lock (its investigation is still running)."""
    from driftscope.errors import DriftscopeError
    from driftscope.run.runlock import run_lock

    try:
        with run_lock(out):
            return False
    except DriftscopeError:
        return True


def _entry(root, commit: str, directory: str) -> dict | None:
    """The newest result in one run directory: its record when that is newer than its report, else the report."""
    record = root.read_json(commit, directory, RECORD)
    report = root.read_json(commit, directory, "report.json")
    if record is None and report is None:
        return None
    judged = report is not None and record is not None and record.get("report_updated") == report.get("updated")
    if record is not None and (judged or report is None or str(record.get("finished")) >= str(report.get("updated"))):
        entry = dict(record, report=report if judged else None)
    else:
        entry = dict(
            from_report(report), name=str(report.get("name") or directory), params=report.get("parameters_file")
        )
        entry.update(commit=commit, reused=False, seconds=duration(report), report=report)
        if report.get("status") == "running":
            if not root.remote and _alive(root.path(commit, directory)):
                entry.update(status="running", error=None)
            else:
                entry["error"] = f"dead: left running at {report.get('stopped_at')} by a process that is gone"
    entry["dir"] = directory
    return entry


def missing_evidence(root, commit: str, directory: str, report: dict | None) -> list[str]:
    """The rendered pages a complete run's parameters ask for (each notebook's ``.html`` and ``.nocode.html``)
    that its directory lacks: a run whose evidence is missing is not a pass."""
    if not report or not directory or report.get("status") != "complete":
        return []
    notebooks = (report.get("parameters") or {}).get("notebooks") or []
    present = set(root.files(commit, directory))
    wanted = [f"{Path(str(name)).stem}{suffix}" for name in notebooks for suffix in (".html", ".nocode.html")]
    return [page for page in wanted if page not in present]


def commit_entries(root, commit: str, latest: list[dict] = ()) -> list[dict]:
    """Every run of ``commit`` under ``root`` (an :class:`~driftscope.core.storage.OutputRoot`), newest result per name.

    ``latest``: this batch's summaries; they are the newest result of their runs, also of runs that could
    not start (which left nothing on disk). Each entry carries its ``report`` (JSON) when it judged one.
    """
    found: dict[str, dict] = {}
    for directory in root.directories(commit):
        entry = _entry(root, commit, directory)
        if entry is None:
            continue
        kept = found.get(entry["name"])
        if kept is None or str(entry.get("finished") or "") > str(kept.get("finished") or ""):
            found[entry["name"]] = entry
    for summary in latest:
        on_disk = found.get(summary["name"]) or {}
        report = on_disk.get("report")
        current = report is not None and summary.get("report_updated") == report.get("updated")
        found[summary["name"]] = dict(
            summary, report=report if current else None, dir=summary.get("dir") or on_disk.get("dir")
        )
    for entry in found.values():
        missing = missing_evidence(root, commit, entry.get("dir"), entry.get("report"))
        if missing and not entry.get("error") and entry.get("status") != "running":
            entry["error"] = f"evidence missing: {', '.join(missing)} (the run's notebooks did not all render)"
    return [found[name] for name in sorted(found)]
