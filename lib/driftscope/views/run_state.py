"""What a run's output directory says to the renderer: whether its pages are current, and where (with what error)
its investigation stopped."""

from __future__ import annotations

from pathlib import Path

from driftscope.errors import DriftscopeError


def rendered_current(out_dir: Path, params) -> bool:
    """Whether ``out_dir`` holds a finished run of these parameters whose notebooks all executed without an
    error and were rendered (``.ipynb``, ``.html``, ``.nocode.html``) after its report was last written."""
    import json

    from driftscope.run.report import Report

    try:
        report = Report.load(Path(out_dir) / "report.json")
        written = report.path.stat().st_mtime
    except (DriftscopeError, OSError):
        return False
    if report.status != "complete" or report.data.get("parameters_digest") != params.digest:
        return False
    from driftscope.run.reuse import stale_reason

    if stale_reason(report.data, params):  # re-judged under another contract, or what it read changed since
        return False
    for name in params.notebooks:
        stem = Path(out_dir) / Path(name).stem
        pages = [stem.with_suffix(".ipynb"), stem.with_suffix(".html"), stem.with_name(stem.name + ".nocode.html")]
        try:
            if any(page.stat().st_mtime < written for page in pages):
                return False
            cells = json.loads(pages[0].read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            return False
        if any(o.get("output_type") == "error" for c in cells for o in c.get("outputs", [])):
            return False
    return True


def written_since(path: Path, started: float) -> bool:
    """Whether ``path`` exists and was written at or after ``started`` (a ``time.time()``)."""
    try:
        return path.stat().st_mtime >= started
    except OSError:
        return False


def stop_cause(report_path: Path) -> tuple[str | None, str | None]:
    """(where, with what error type) a report's investigation stopped; (None, None) when it did not."""
    from driftscope.run.report import Report

    try:
        report = Report.load(report_path)
    except DriftscopeError:
        return None, None
    if report.status not in ("error", "dead"):
        return None, None
    return str(report.data.get("stopped_at")), (report.data.get("error") or {}).get("type")


def stopped_at(report_path: Path) -> str | None:
    """Where a report's investigation stopped with an error or was killed, or None (no report, or it did not)."""
    return stop_cause(report_path)[0]
