"""Where a run given no output directory writes (a notebook in JupyterLab, a script)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from driftscope.errors import ReportError
from driftscope.run.report import Report

INTERACTIVE = "interactive"  # outputs/interactive/<commit>/<name>-<digest>/


def interactive_out_dir(params, default: Path, log: Callable[[str], None] = print) -> Path:
    """``default`` (the commit's run directory, ``outputs/<commit>/<name>/``) when it holds no report or a report
    of these same parameters, so a notebook reuses what ``driftscope run`` rendered; else
    ``outputs/interactive/<commit>/<name>-<digest>/``, so an interactive run of other parameters, finished or
    failed, never replaces another run's report. That directory is no commit's: the evidence index and
    ``driftscope diff`` do not list it."""
    report = default / "report.json"
    try:
        previous = Report.load(report)
    except ReportError as err:
        if not report.exists():
            return default
        log(f"the report in {default} is unreadable ({err.problem}): this run writes elsewhere")
    else:
        if previous.data.get("parameters_digest") == params.digest:
            return default
    own = default.parent.parent / INTERACTIVE / default.parent.name / f"{default.name}-{params.digest}"
    log(f"{default} holds another run's report: this one writes to {own}")
    return own
