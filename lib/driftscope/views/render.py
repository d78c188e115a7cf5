"""Execute a run's notebooks one after another and render each one's pages (also when it failed)."""

from __future__ import annotations

import time
from pathlib import Path

from driftscope.errors import DriftscopeError

from .execution import execute
from .failure import notebook_error
from .pages import to_html
from .run_state import stop_cause, stopped_at, written_since


def run_notebooks(
    names,
    out_dir: Path,
    params_path: Path,
    reuse: bool,
    cwd: Path,
    log=None,
    notebook_dir: Path | None = None,
    echo: bool | None = None,
    kernels=None,
    pages=None,
) -> dict[str, str]:
    """Execute each notebook on one parameter file and render its HTML (also when it failed).

    Returns ``{notebook: error}`` for the notebooks that raised; the others still run, unless the
    investigation itself stopped with an error: then the rest are not run (each would run it again).
    ``echo``: stream the notebooks' output to this process's log (default: when ``log`` is given).
    ``kernels``: a :class:`driftscope.views.render_process.KernelQueue` of warm kernels; ``pages``: reused
    :class:`driftscope.views.warm.Exporters`.
    """
    errors = {}
    started = time.time()
    report_path = out_dir / "report.json"
    for name in names:
        stopped = stopped_at(report_path) if errors else None
        if stopped:
            errors[name] = f"not run: the investigation stopped at {stopped}"
            if log:
                log(f"notebook {name} {errors[name]}")
            continue
        fresh = written_since(
            report_path, started
        )  # a run an earlier notebook of this call made is reused, forced or not
        try:
            execute(
                name,
                out_dir,
                {"params_path": str(params_path), "out_dir": str(out_dir), "reuse": reuse or fresh},
                cwd=cwd,
                log_output=log is not None if echo is None else echo,
                notebook_dir=notebook_dir,
                kernel=kernels.take(name) if kernels is not None else None,
            )
        except Exception as err:  # noqa: BLE001 - papermill raises PapermillExecutionError with the cell's error
            error = f"{getattr(err, 'ename', type(err).__name__)}: {getattr(err, 'evalue', err)}".strip()
            errors[name] = notebook_error(error, *stop_cause(report_path))
            if log:
                log(f"notebook {name} failed: {errors[name]}")
        executed = out_dir / f"{Path(name).stem}.ipynb"
        if executed.exists():
            html, nocode = to_html(executed, pages)
            if log:
                log(f"rendered {html.name} and {nocode.name}")
    return errors


DRILLDOWN = "02_layer_drilldown"


def drilldown_for_failing(names: list[str], out_dir: Path) -> list[str]:
    """``[DRILLDOWN]`` when the run in ``out_dir`` finished with a failing verdict and its pages ``names`` (not
    none) leave the drill-down out: a failing run renders where and why it fails by default."""
    from driftscope.run.report import Report

    if not names or any(Path(name).stem == DRILLDOWN for name in names):
        return []
    try:
        report = Report.load(Path(out_dir) / "report.json")
    except (DriftscopeError, OSError):
        return []
    failed = report.status == "complete" and (report.data.get("verdict") or {}).get("status") == "fail"
    return [DRILLDOWN] if failed else []
