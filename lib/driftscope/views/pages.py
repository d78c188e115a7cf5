"""The two HTML pages of an executed notebook (with its code, and without), rendered with nbconvert."""

from __future__ import annotations

from pathlib import Path

from driftscope.core.atomic import write_text_atomic
from driftscope.core.paths import NOTEBOOKS

from .failure import fold_errors

TEMPLATES = Path(__file__).resolve().parent / "templates"  # "offline": the lab template without CDN scripts


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
    child = fork(lambda: _page(notebook, executed, pages, True, targets[1]))
    try:
        _page(notebook, executed, pages, False, targets[0])
    finally:
        rendered = child is not None and succeeded(child)  # waited for even when this page raised: no zombie
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
        page_body(notebook, NOTEBOOKS, pages, exclude)


def fork(work) -> int | None:
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


def succeeded(pid: int) -> bool:
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
    roots = [(Path(out_dir).resolve(), "<this run>"), (NOTEBOOKS.parent, "")]
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
