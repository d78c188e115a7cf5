"""Execute notebooks with papermill and render them to HTML with nbconvert (with and without code)."""

from __future__ import annotations

import time
from pathlib import Path

from driftscope.core.atomic import write_text_atomic
from driftscope.core.paths import NOTEBOOKS
from driftscope.errors import DriftscopeError

from .failure import fold_errors, notebook_error

NOTEBOOK_DIR = NOTEBOOKS  # shipped in the package (a repository's notebooks/ links here)
KERNEL_NAME = "driftscope"
TEMPLATES = Path(__file__).resolve().parent / "templates"  # "offline": the lab template without CDN scripts


def kernel_name() -> str:
    """The project's registered kernel, or the current interpreter's own kernel when it is missing."""
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    if KERNEL_NAME in specs:
        return KERNEL_NAME
    if "python3" in specs:
        return "python3"
    raise DriftscopeError(
        "no Jupyter kernel to run notebooks with", "run `make setup` (it registers the 'driftscope' kernel)"
    )


def notebook_path(name: str, notebook_dir: Path | None = None) -> Path:
    directory = notebook_dir or NOTEBOOK_DIR
    path = directory / (name if name.endswith(".ipynb") else f"{name}.ipynb")
    if not path.exists() and notebook_dir is not None:
        return notebook_path(name)  # a tree without this notebook: use the installed one
    if not path.exists():
        known = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))
        raise DriftscopeError(f"notebook {name!r} does not exist", f"use one of: {', '.join(known)}")
    return path


def kernel_config():
    """The kernel manager's configuration: CurveZMQ keys where the kernel supports them."""
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport_encryption = "auto"
    return config


def execute(
    name: str,
    out_dir: Path,
    parameters: dict,
    cwd: Path,
    log_output: bool = True,
    notebook_dir: Path | None = None,
    kernel=None,
) -> Path:
    """Run one notebook into ``out_dir/<name>.ipynb``; the executed copy is written even if it fails.

    ``kernel``: a :class:`driftscope.views.warm.WarmKernel` started for it in ``cwd`` (shut down afterwards);
    without one papermill starts a kernel of its own."""
    import papermill

    from .engine import register

    out_dir.mkdir(parents=True, exist_ok=True)
    source = notebook_path(name, notebook_dir)
    target = out_dir / source.name
    given = {"km": kernel.ready()} if kernel is not None else {}
    try:
        papermill.execute_notebook(
            str(source),
            str(target),
            parameters=parameters,
            kernel_name=kernel_name(),
            engine_name=register(),  # papermill's nbclient engine, without its writes before and after each cell
            cwd=str(cwd),
            log_output=log_output,
            progress_bar=False,
            report_mode=False,
            shutdown_kernel="immediate",  # every output is in by then; a graceful shutdown waited ~2 s
            config=kernel_config(),
            **given,
        )
    finally:
        if kernel is not None:
            kernel.shutdown()
    return target


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
        stopped = _stopped_at(report_path) if errors else None
        if stopped:
            errors[name] = f"not run: the investigation stopped at {stopped}"
            if log:
                log(f"notebook {name} {errors[name]}")
            continue
        fresh = _since(report_path, started)  # a run an earlier notebook of this call made is reused, forced or not
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
            errors[name] = notebook_error(error, *_stop_cause(report_path))
            if log:
                log(f"notebook {name} failed: {errors[name]}")
        executed = out_dir / f"{Path(name).stem}.ipynb"
        if executed.exists():
            html, nocode = to_html(executed, pages)
            if log:
                log(f"rendered {html.name} and {nocode.name}")
    return errors


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


def _since(path: Path, started: float) -> bool:
    """Whether ``path`` exists and was written at or after ``started`` (a ``time.time()``)."""
    try:
        return path.stat().st_mtime >= started
    except OSError:
        return False


def _stop_cause(report_path: Path) -> tuple[str | None, str | None]:
    """(where, with what error type) a report's investigation stopped; (None, None) when it did not."""
    from driftscope.run.report import Report

    try:
        report = Report.load(report_path)
    except DriftscopeError:
        return None, None
    if report.status not in ("error", "dead"):
        return None, None
    return str(report.data.get("stopped_at")), (report.data.get("error") or {}).get("type")


def _stopped_at(report_path: Path) -> str | None:
    """Where a report's investigation stopped with an error or was killed, or None (no report, or it did not)."""
    return _stop_cause(report_path)[0]


#: What the render process imports before it starts a kernel (papermill, nbclient, the kernel client, nbformat's
#: validator, nbconvert and its Jinja templates): all of it before its kernel thread starts, so the two threads
#: never compile at once (CPython 3.11's AST state is not thread-safe: "AST constructor recursion depth mismatch").
NOTEBOOK_STACK = (
    "papermill",
    "papermill.execute",
    "papermill.engines",
    "papermill.translators",
    "papermill.parameterize",
    "papermill.iorw",
    "nbclient",
    "nbclient.client",
    "jupyter_client.manager",
    "jupyter_client.kernelspec",
    "jupyter_client.provisioning",
    "nbformat",
    "nbconvert",
    "nbconvert.exporters.html",
    "jinja2",
    "traitlets.config",
    "zmq.asyncio",
)


def prepare_notebook_stack(names) -> None:
    """Import the notebook stack and read each notebook once (nbformat builds its schema validator)."""
    import importlib

    from driftscope.core.validation import draft_2020_12

    draft_2020_12()  # nbformat validates with jsonschema: imported first without its optional IRI grammar
    import nbformat

    for module in NOTEBOOK_STACK:
        importlib.import_module(module)
    for name in names:
        try:
            nbformat.validate(nbformat.read(str(notebook_path(name)), as_version=4))
        except Exception:  # noqa: BLE001 - a missing or broken notebook is the run's to report, with its name
            continue
    kernel_name()  # jupyter_client's kernel spec lookup (entry points, paths)
    from .engine import register

    register()


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


def to_html(executed: Path, pages=None) -> tuple[Path, Path]:
    """``<name>.html`` (with code) and ``<name>.nocode.html`` next to the executed notebook (``pages``: reused
    :class:`driftscope.views.warm.Exporters`, else two made here).

    On Linux the no-code page is rendered in a forked child while this process renders the other (nbconvert is
    pure Python: one core each; ~1 s of the time after the verdict, issue 38 item 3); a child that fails leaves
    its page to this process, which renders it as before (and raises what it raises)."""
    import nbformat

    from .warm import Exporters

    pages = pages or Exporters(TEMPLATES)
    notebook = nbformat.read(str(executed), as_version=4)
    targets = [executed.with_name(executed.stem + suffix) for suffix in (".html", ".nocode.html")]
    child = _fork(lambda: _page(notebook, executed, pages, True, targets[1]))
    try:
        _page(notebook, executed, pages, False, targets[0])
    finally:
        rendered = child is not None and _succeeded(child)  # waited for even when this page raised: no zombie
    if not rendered:
        _page(notebook, executed, pages, True, targets[1])
    return targets[0], targets[1]


def _page(notebook, executed: Path, pages, exclude: bool, target: Path) -> None:
    """One page of the executed ``notebook``: with its code, or without (``exclude``)."""
    write_text_atomic(target, page_body(notebook, executed.parent, pages, exclude))


def page_body(notebook, out_dir: Path, pages, exclude: bool) -> str:
    """The HTML of one page of an executed notebook of ``out_dir``: with its code, or without (``exclude``)."""
    from .interactive import page_ready, page_with_plotly

    shown = fold_errors(without_code(notebook) if exclude else shorten_parameters(notebook, out_dir))
    shown, plotly = page_ready(shown)  # widgets in words; interactive figures, or their PNGs over the budget
    body, _ = pages.pages[exclude].from_notebook_node(shown)
    return page_with_plotly(body) if plotly else body  # plotly.js once, inlined: the page opens offline


def warm_pages(pages) -> None:
    """Render both pages of :func:`driftscope.views.warm.page_warm_up` (not written): what a page needs beyond
    the exporters' templates is imported and made once (the views' page helpers and what they import, matplotlib
    and plotly among them, the highlighter, the Markdown parser's table and code paths, BeautifulSoup's selectors):
    ~1 s of the first real page's time, paid by both pages when they render at once, each in its process."""
    from .warm import page_warm_up

    notebook = page_warm_up()
    for exclude in (False, True):
        page_body(notebook, NOTEBOOK_DIR, pages, exclude)


def _fork(work) -> int | None:
    """Run ``work`` in a forked child; the child's pid, or None where this does not fork: off Linux (a macOS
    process that has loaded Apple's frameworks must not fork without exec) and in a process that imported JAX or
    MLX (their threads; JAX warns of a deadlock at every fork). The render process imports neither."""
    import os
    import sys

    if sys.platform != "linux" or not hasattr(os, "fork") or {"jax", "mlx"} & set(sys.modules):
        return None
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        work()
        code = 0
    except BaseException:  # noqa: BLE001 - the parent renders the page again and reports the error itself
        pass
    finally:
        os._exit(code)  # no atexit handler, no buffer of the parent's flushed twice


def _succeeded(pid: int) -> bool:
    import os

    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _injected(cell) -> bool:
    return "injected-parameters" in cell.get("metadata", {}).get("tags", [])


def without_code(notebook):
    """The notebook a reader without code sees: code cells that show nothing (the parameters, papermill's
    injected copy of them, imports) are dropped, so the page starts with what the first cell shows."""
    import copy

    shown = copy.deepcopy(notebook)
    shown.cells = [c for c in shown.cells if c.cell_type != "code" or (c.get("outputs") and not _injected(c))]
    return shown


def shorten_parameters(notebook, out_dir: Path):
    """The notebook with papermill's injected parameters cell shortened to one line, paths under the
    repository or the run's directory written relative to them."""
    import ast
    import copy

    shown = copy.deepcopy(notebook)
    roots = [(Path(out_dir).resolve(), "<this run>"), (NOTEBOOK_DIR.parent, "")]
    for cell in shown.cells:
        if cell.cell_type != "code" or not _injected(cell):
            continue
        given = []
        for line in cell.source.splitlines():
            name, _, value = line.partition(" = ")
            if not value or not name.isidentifier():
                continue
            try:
                literal = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                literal = value
            given.append(f"{name}={_short(literal, roots)!r}" if isinstance(literal, str) else f"{name}={value}")
        cell.source = "# given to this run (paths relative to the repository): " + ", ".join(given)
    return shown


def _short(value: str, roots: list[tuple[Path, str]]) -> str:
    if not Path(value).is_absolute():
        return value
    for root, label in roots:
        try:
            relative = Path(value).resolve().relative_to(root)
        except (ValueError, OSError):
            continue
        return str(Path(label) / relative) if label else str(relative)
    return value
