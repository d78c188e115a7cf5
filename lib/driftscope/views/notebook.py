"""Notebook plumbing: figures with alt text, tables that never hide a row, and an investigation whose
progress log goes to a collapsed section at the end of the page instead of its top.

Every notebook starts with :func:`setup` (or :func:`investigate`, which calls it).
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from driftscope.core.markup import html_text

from . import failure

FAILING = ("fail", "shape_mismatch", "layout_mismatch")  # row statuses drawn red
ALT = "driftscope_alt"  # the attribute a view sets on its figure: the figure's alternative text


def plural(count: int, noun: str) -> str:
    """``"1 failure"``, ``"4 failures"``: a count and its noun, singular for one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def coordinates(value) -> str:
    """An element's coordinates as ``(698, 10)``, never a list's repr; "" for none."""
    if value is None:
        return ""
    return f"({', '.join(map(str, value))})" if isinstance(value, list | tuple) else str(value)


def describe(figure, text: str):
    """Give ``figure`` its alternative text (what a reader who cannot see it should know); returns it."""
    setattr(figure, ALT, text)
    return figure


def alt_text(figure) -> str:
    """The figure's alternative text: what its view said, else its titles."""
    given = getattr(figure, ALT, None)
    if given:
        return str(given)
    titles = [figure._suptitle.get_text()] if getattr(figure, "_suptitle", None) else []
    titles += [axis.get_title() for axis in figure.axes if axis.get_title()]
    return "; ".join(titles) or "a figure of this run"


def _png(figure) -> tuple[bytes, dict]:
    from IPython.core.pylabtools import print_figure

    from .figure_facts import facts_json

    png = print_figure(figure, "png", bbox_inches="tight")  # drawn: its facts reuse the layout
    return png, {"alt": alt_text(figure), "figure": facts_json(figure, drawn=True)}


def setup() -> None:
    """Figures display as PNG with their alt text (the HTML carries it); pandas shows every row and column;
    progress bars are text (never widgets), their warnings not printed; a driftscope error shows as its message and fix,
    the traceback folded below (:mod:`driftscope.views.failure`)."""
    import pandas as pd
    from matplotlib.figure import Figure

    try:
        from IPython import get_ipython
    except ImportError:  # not in a notebook
        get_ipython = None
    shell = get_ipython() if get_ipython else None
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(Figure, _png)
        failure.install(shell)  # a driftscope error: one message with its fix, the traceback folded below
    for option in ("display.max_rows", "display.max_columns", "display.max_colwidth", "display.width"):
        pd.set_option(option, None)
    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto in a kernel without widgets
    _text_progress_bars()


def _text_progress_bars() -> None:
    """``tqdm.auto`` draws text bars here, not widgets: ipywidgets is installed (the lab's explorer), and a widget
    bar would leave an empty widget in a rendered page instead of a line in the collapsed progress log."""
    try:
        import tqdm.auto
        import tqdm.std
    except ImportError:
        return
    tqdm.auto.tqdm, tqdm.auto.trange = tqdm.std.tqdm, tqdm.std.trange


@dataclass
class ProgressLog:
    """What an investigation printed; shown as a collapsed section."""

    text: str

    def _repr_html_(self) -> str:
        lines = plural(len(self.text.splitlines()), "line")
        body = html_text(self.text) if self.text else "(nothing was printed)"
        return (
            f"<details><summary>Progress log ({lines}): what the investigation printed</summary>"
            f"<pre style='font-size:11px;white-space:pre-wrap'>{body}</pre></details>"
        )

    def __repr__(self) -> str:
        return self.text


class _Tee(io.TextIOBase):
    """Writes go to a buffer and, live, to the stream the notebook shows."""

    def __init__(self, stream, buffer: io.StringIO):
        self.stream, self.buffer = stream, buffer

    def write(self, text: str) -> int:
        self.buffer.write(text)
        with contextlib.suppress(Exception):
            self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.stream.flush()


def investigate(params_path: str | Path, out_dir: str | Path | None = None, reuse: bool = True):
    """Run (or reuse) the investigation; ``(report, log)`` where ``log`` is its progress as a collapsed section.

    The progress is shown live while it runs and cleared when it ends, so the page starts with the verdict;
    an investigation that fails leaves its progress and error in place."""
    from driftscope.run.investigation import investigate as run

    setup()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, buffer)), contextlib.redirect_stderr(_Tee(sys.stderr, buffer)):
        report = run(params_path, out_dir, reuse=reuse)
    with contextlib.suppress(ImportError):
        from IPython.display import clear_output

        clear_output()
    return report, ProgressLog(buffer.getvalue())


#: a table with more rows than this scrolls in a box of its own, its header kept in view (every row is still there)
LONG_TABLE = 30


def scroll(styler):
    """A pandas Styler's HTML (every row) in a box that scrolls sideways, its first column kept in view; a table of
    more than :data:`LONG_TABLE` rows also scrolls down inside its box, its header kept at the top."""
    from IPython.display import HTML

    styler = styler.set_table_styles(
        [
            {"selector": "td, th", "props": "white-space:nowrap;padding:2px 8px;font-size:12px;text-align:left"},
            {"selector": "tbody th, td:first-child, th:first-child", "props": "position:sticky;left:0"},
            {"selector": "tbody th, th:first-child", "props": "background-color:#fff"},
            {"selector": "thead th", "props": "position:sticky;top:0;z-index:2;background-color:#fff"},
            {"selector": "thead th:first-child", "props": "z-index:3"},
        ],
        overwrite=False,
    )
    tall = len(styler.data) > LONG_TABLE
    box = "overflow:auto;max-width:100%;max-height:70vh" if tall else "overflow-x:auto;max-width:100%"
    return HTML(
        f'<div class="driftscope-table{" driftscope-long" if tall else ""}" style="{box}">{styler.to_html()}</div>'
    )


def _cell(value):
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return coordinates(value)
    return value


def table(
    frame,
    highlight: str | None = "status",
    first: str | None = None,
    digits: int = 3,
    wrap: tuple[str, ...] = (),
    fit: bool = False,
    anywhere: tuple[str, ...] = (),
):
    """``frame`` as HTML with every row, escaped, in a box that scrolls sideways (its first column stays in
    view); rows whose ``highlight`` column is a failing status are red; ``wrap`` columns wrap their text (long
    sentences read in full); booleans read yes/no and lists (0, 1). ``fit``: a headline table that fits the page
    (1400 px): its headers and ``wrap`` columns wrap where there is a space, its ``anywhere`` columns (long dotted
    names) anywhere. An empty frame is returned as it is."""
    if frame.empty:
        return frame
    frame = frame.reset_index(drop=True)
    for column in frame.columns:  # words, never a Python value's repr: (0, 1) for a list, yes/no for a bool
        if frame[column].dtype == bool:
            frame[column] = frame[column].map({True: "yes", False: "no"})
        elif frame[column].dtype == object:
            frame[column] = frame[column].map(_cell)
    if first and first in frame.columns:
        frame = frame[[first, *[c for c in frame.columns if c != first]]]
    bad = frame[highlight].isin(FAILING).to_numpy() if highlight in frame.columns else [False] * len(frame)

    def colour(row) -> list[str]:  # the sticky first cell needs an opaque background of its own
        background = "#f8d0d0" if bad[row.name] else ("#f5f5f5" if row.name % 2 else "#fff")
        return [f"background-color:{background}" if i == 0 or bad[row.name] else "" for i in range(len(row))]

    floats = [c for c in frame.columns if frame[c].dtype.kind == "f"]
    words = [c for c in frame.columns if frame[c].dtype.kind in "OSUb" or str(frame[c].dtype) == "str"]
    styler = frame.style.hide(axis="index").apply(colour, axis=1).set_properties(subset=words, **{"text-align": "left"})
    wrapped = [c for c in wrap if c in frame.columns]
    if fit:
        broken = [c for c in anywhere if c in frame.columns]
        narrow = {"white-space": "normal !important", "min-width": "6em"}
        styler = styler.set_properties(subset=wrapped, **narrow) if wrapped else styler
        for column in broken:  # as wide as its longest word (up to 32 characters), broken only past that
            longest = max((len(word) for value in frame[column].astype(str) for word in value.split()), default=0)
            wide = {
                "white-space": "normal !important",
                "overflow-wrap": "anywhere",
                "min-width": f"{min(longest, 32)}ch",
            }
            styler = styler.set_properties(subset=[column], **wide)
    elif wrapped:
        styler = styler.set_properties(subset=wrapped, **{"white-space": "normal !important", "min-width": "28em"})
    if fit:  # headers wrap, and the text is a size smaller than the other tables' (12px)
        small = [{"selector": "th", "props": "white-space:normal !important"}]
        small.append({"selector": "td, th", "props": "font-size:11px !important;padding:2px 5px !important"})
        styler = styler.set_table_styles(small, overwrite=False)
    styler = (
        styler.format(na_rep="", escape="html")
        .format({c: f"{{:.{digits}g}}" for c in floats}, na_rep="", escape="html")
        .format_index(escape="html", axis=1)
    )
    return scroll(styler)


def details(summary: str, html_body: str, open_: bool = False):
    """A collapsed section (``summary`` is escaped; ``html_body`` is HTML the caller escaped)."""
    from IPython.display import HTML

    return HTML(f"<details{' open' if open_ else ''}><summary>{html_text(summary)}</summary>{html_body}</details>")


def family_text(report, key: str) -> str:
    """The run's model family's own sentence for ``key`` on this page (``Family.text``): "" when it has none."""
    from driftscope.families import get_family

    family = report.data.get("family")
    return get_family(family).text(key) if family else ""
