"""An error, said once: its type, the problem and the fix, with the traceback folded below (issue 34 item 3).

Three places show one: a notebook's kernel (the lab, and papermill's executed copy), the rendered HTML of a
notebook that stopped, and the command line's summary of a run that could not finish.

- :func:`install` makes the kernel show a driftscope error as that message (the cell's error output) and its
  traceback as a collapsed section after it; the cell still fails, so papermill and the CLI see the error.
- :func:`fold_errors` does the same to an executed notebook before it is rendered (an error of any type, from any
  kernel), drops papermill's banners and the cells that never ran, and says so once.
- :func:`summary_lines` is the CLI's summary of a run's errors: the investigation's error is named once, and the
  notebooks that showed it or were not run because of it are listed in one line.
"""

from __future__ import annotations

import copy
import re

from driftscope.core.markup import html_text

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
FIX = "\n  fix: "
TRACEBACK_CLASS = "driftscope-traceback"
PAPERMILL_BANNER = "papermill-error-cell-tag"
NOT_RUN = "*The cells after this one did not run: the error above stopped the notebook.*"


def split(message: str) -> tuple[str, list[str]]:
    """``(problem, fixes)`` of an error message (``DriftscopeError``: ``problem\\n  fix: fix``); each fix once."""
    problem, *fixes = message.split(FIX)
    unique = list(dict.fromkeys(fix.strip() for fix in fixes if fix.strip()))
    return problem.strip(), unique


def message_lines(ename: str, evalue: str) -> list[str]:
    """The error as the lines a reader reads: ``Type: problem`` (its name in red), then ``fix: ...``."""
    problem, fixes = split(evalue)
    return [f"\x1b[0;31m{ename}\x1b[0m: {problem}"] + [f"  fix: {fix}" for fix in fixes]


def traceback_html(traceback_text: str) -> str:
    """The traceback as a collapsed section (escaped, colours removed)."""
    plain = ANSI.sub("", traceback_text).strip("\n")
    lines = len(plain.splitlines())
    return (
        f"<details class='{TRACEBACK_CLASS}'><summary>Traceback ({lines} line{'s' if lines != 1 else ''})"
        f"</summary><pre style='font-size:11px;white-space:pre-wrap'>{html_text(plain)}</pre></details>"
    )


def _show(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler: the message as the cell's error output, then the folded traceback."""
    from IPython.display import HTML, display

    structured = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    full = shell.InteractiveTB.stb2text(structured)
    shell._showtraceback(etype, value, message_lines(etype.__name__, str(value)))
    display(HTML(traceback_html(full)))
    return None


def install(shell) -> None:
    """Show every driftscope error raised in ``shell``'s cells as one message with its fix, traceback folded."""
    from driftscope.errors import DriftscopeError

    shell.set_custom_exc((DriftscopeError,), _show)


def _is_folded(outputs: list, index: int) -> bool:
    following = outputs[index + 1] if index + 1 < len(outputs) else None
    data = (following or {}).get("data", {}) if following else {}
    return TRACEBACK_CLASS in str(data.get("text/html", ""))


def _fold_outputs(outputs: list) -> list:
    import nbformat

    folded = []
    for index, output in enumerate(outputs):
        if output.get("output_type") != "error" or _is_folded(outputs, index):
            folded.append(output)
            continue
        short = copy.deepcopy(output)
        short["traceback"] = message_lines(output.get("ename", "Error"), output.get("evalue", ""))
        folded.append(short)
        full = "\n".join(output.get("traceback") or [])
        folded.append(nbformat.v4.new_output("display_data", data={"text/html": traceback_html(full)}))
    return folded


def fold_errors(notebook):
    """A copy of an executed notebook as a failed one should read: each error its message and fix, the traceback
    folded after it; papermill's banners gone; the cells after the first error (which never ran) replaced by one
    line saying so. A notebook without an error is returned as it is."""
    import nbformat

    cells = [c for c in notebook.cells if PAPERMILL_BANNER not in c.get("metadata", {}).get("tags", [])]
    stopped = next(
        (
            i
            for i, c in enumerate(cells)
            if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.get("outputs", []))
        ),
        None,
    )
    if stopped is None:
        return notebook
    shown = copy.deepcopy(notebook)
    shown.cells = copy.deepcopy(cells[: stopped + 1])
    shown.cells[stopped].outputs = _fold_outputs(shown.cells[stopped].outputs)
    if stopped + 1 < len(cells):
        shown.cells.append(nbformat.v4.new_markdown_cell(NOT_RUN))
    return shown


STOPPED_WITH = "the investigation stopped"


def summary_lines(errors: dict[str, str], stopped_at: str | None = None, error_type: str | None = None) -> list[str]:
    """What could not run, each error once. ``errors``: ``{notebook or "investigation": message}``;
    ``stopped_at``, ``error_type``: where the investigation stopped and with what (its report's). Its own message
    and fix were logged when it stopped: here it is named, not repeated; the notebooks that showed it or were not
    run because of it are listed in one line."""
    lines, showing, not_run = [], [], []
    if "investigation" in errors:
        kind = error_type or errors["investigation"].split(":", 1)[0]
        where = f"stopped at {stopped_at}" if stopped_at else "it could not start"
        lines.append(f"could not run: investigation: {kind} ({where}; its message and fix are above)")
    for name, error in errors.items():
        if name == "investigation":
            continue
        if error.startswith("not run: the investigation"):
            not_run.append(name)
        elif error.startswith(STOPPED_WITH):
            showing.append(name)
        else:
            problem, fixes = split(error)
            lines.append(f"could not run: {name}: {problem}" + "".join(f"{FIX}{fix}" for fix in fixes))
    parts = [f"{', '.join(showing)} rendered with the investigation's error"] if showing else []
    parts += [f"{', '.join(not_run)} not run"] if not_run else []
    if parts:
        lines.append("notebooks: " + "; ".join(parts))
    return lines


def notebook_error(error: str, stopped_at: str | None, error_type: str | None) -> str:
    """A notebook's error for the run's log and summary: when the investigation stopped, the notebook only shows
    that error, named by its type and step (not repeated)."""
    if not stopped_at:
        return error
    return f"{STOPPED_WITH} ({error_type or 'error'} at {stopped_at}); rendered with its error"


def pages_beside_the_verdict(report, errors: dict[str, str], log) -> None:
    """Log each page that failed after a finished run and record it in the report (``pages_failed``), next to the
    verdict it leaves as it is."""
    report.data["pages_failed"] = dict(errors)
    report.save()
    for name, error in errors.items():
        log(f"page {name} failed: {error} (the verdict, {report.verdict}, stands; the page shows the error)")
