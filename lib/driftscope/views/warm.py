"""Kernels and HTML exporters made ready before the report exists (issue 38, item 3).

A notebook's kernel is started, and the modules its cells import are imported in it, while the investigation is
still capturing; nbconvert's two exporters (with and without code) compile their templates then too. What is left
once the report exists is the cells that read it and the two HTML pages.

The warm-up runs in the kernel as a *silent* request that stores no history: it sends no output, does not count
as a cell (the first cell is still ``In [1]``) and leaves no name in the notebook's namespace, so the executed
notebook is the one a cold kernel would give. Only imports (each allowed to fail: the cell that needs it shows
the error, as before), a first figure drawn off-screen and a first table styled are done early.
"""

from __future__ import annotations

import ast
import json
import threading
from pathlib import Path

#: What the warm-up runs in the kernel, in a namespace of its own, after ``IMPORTS = [statement, ...]``.
WARM_UP = """
import io
for statement in IMPORTS:
    try:
        exec(statement, {})
    except BaseException:
        pass
try:  # a figure like the error curves: constrained layout, shared x, log and symlog panels, rotated labels, a
    # legend, markers of several kinds, a tight PNG (the first of each costs the views' first figure ~0.1-0.3 s)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator
    figure = Figure(figsize=(4, 3), layout="constrained")
    axes = figure.subplots(3, 1, sharex=True, squeeze=False)[:, 0]
    for axis, marker in zip(axes, ["o", "s", "^"]):
        axis.plot([0, 1, 2], [1e-3, None, 1e-1], color="#d62728", linewidth=1.0, alpha=0.85, marker=marker,
                  markersize=8, markerfacecolor="none", markeredgewidth=1.1, label="x")
        axis.plot([1], [0.0], linestyle="none", marker="_", transform=axis.get_xaxis_transform(), clip_on=False)
        axis.plot([1], [1e-2], marker="*", markersize=14, color="#1f77b4", zorder=5)
        axis.axvline(1, color="#1f77b4", linestyle="--", linewidth=1)
        axis.axvspan(-0.5, 0.5, color="#000000", alpha=0.05, linewidth=0, zorder=0)
        axis.grid(True, which="major", alpha=0.3)
        axis.set_ylabel("y")
    axes[0].set_yscale("log")
    axes[0].axhline(1.0, color="black", linewidth=1.2, label="line")
    axes[0].set_title("t", fontsize=9)
    axes[0].text(0.5, 1.01, "b0", transform=axes[0].get_xaxis_transform(), ha="center", va="bottom", fontsize=6.5)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0.0)
    axes[1].set_yscale("symlog", linthresh=1.0, linscale=0.4)
    axes[1].yaxis.set_major_locator(FixedLocator([0.0, 1.0, 10.0]))
    axes[1].yaxis.set_minor_locator(NullLocator())
    axes[2].yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=2))
    axes[2].yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{int(round(value)):,}"))
    axes[-1].set_xticks(range(3), ["a.b", "c", "d.e"], rotation=90, fontsize=7)
    axes[-1].set_xlabel("x (★)")
    figure.suptitle("s", fontsize=11)
    from IPython.core.pylabtools import print_figure
    print_figure(figure, "png", bbox_inches="tight")
except BaseException:
    pass
try:
    import pandas
    pandas.DataFrame({"a": [1.0]}).style.format(precision=2).to_html()
except BaseException:
    pass
try:  # the report's schema check: jsonschema imported (0.5 s, its format module's patterns), the validator built
    from driftscope.run.report_schema import schema_problem
    schema_problem({})
except BaseException:
    pass
try:  # plotly loads a validator module per property on first use: a figure with the properties the views set
    import plotly.graph_objects as go
    import plotly.io
    from plotly.subplots import make_subplots
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.04, subplot_titles=["a", "b"])
    figure.add_trace(
        go.Scatter(x=[0, 1], y=[1.0, None], mode="lines+markers", name="a", legendgroup="a", showlegend=True,
                   line={"color": "#000000", "width": 1}, connectgaps=False, customdata=[["a"], ["b"]],
                   hovertemplate="%{customdata[0]}<extra></extra>", marker={"symbol": "circle", "size": 8}),
        row=1, col=1,
    )
    figure.add_trace(go.Heatmap(z=[[0.0, 1.0]], x=[0, 1], colorscale="Viridis", zmin=0, zmax=1, hoverongaps=False,
                                colorbar={"title": {"text": "c"}}), row=2, col=1)
    figure.update_layout(height=200, width=300, legend={"orientation": "h"}, margin={"l": 10, "r": 10, "t": 10},
                         hovermode="closest", title={"text": "t"}, showlegend=True)
    figure.update_yaxes(type="log", range=[0, 1], exponentformat="power", showgrid=True, title_text="y", row=1, col=1)
    figure.update_yaxes(tickformat=",d", rangemode="tozero", autorange="reversed", row=2, col=1)
    figure.update_xaxes(tickmode="array", tickvals=[0, 1], ticktext=["a", "b"], tickangle=-90, title_text="x")
    figure.add_hline(y=1.0, line={"color": "black", "width": 1.2}, row=1, col=1, annotation_text="t",
                     annotation_position="top left")
    figure.add_vrect(x0=-0.5, x1=0.5, fillcolor="#000000", opacity=0.06, line_width=0)
    figure.add_annotation(x=0.5, y=1.0, xref="x", yref="y domain", text="b0", showarrow=False, yanchor="bottom",
                          font={"size": 9})
    figure.update_layout(template="simple_white")
    plotly.io.to_html(figure, include_plotlyjs=False, full_html=False)
    figure.to_json()
except BaseException:
    pass
"""


#: Modules the views import inside their functions (in no notebook cell), imported by the warm-up too.
VIEW_IMPORTS = (
    "import pandas",
    "from matplotlib.colors import Normalize",
    "from PIL import Image",
    "import plotly.graph_objects",
    "import plotly.io",
    "from plotly.subplots import make_subplots",
    "from plotly.offline import get_plotlyjs",
    "from driftscope.inputs.rgb import to_rgb",
)


def notebook_imports(path: Path) -> list[str]:
    """The import statements of a notebook's code cells (any nesting level), in order, each once.

    Read as the JSON it is: nbformat's validator (jsonschema) is not needed to list a notebook's imports."""
    statements: list[str] = []
    for cell in json.loads(Path(path).read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        try:
            tree = ast.parse("".join(source) if isinstance(source, list) else source)
        except SyntaxError:  # a cell with IPython magics: its imports are the cell's own business
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "level", 0) == 0:
                statement = ast.unparse(node)
                if statement not in statements:
                    statements.append(statement)
    return statements


def warm_up_code(path: Path, extra: tuple[str, ...] = VIEW_IMPORTS) -> str:
    """The kernel request: :data:`WARM_UP` run by ``exec`` in a fresh namespace (the notebook's stays empty), on
    the notebook's imports and ``extra``."""
    source = f"IMPORTS = {json.dumps(notebook_imports(path) + list(extra))}\n{WARM_UP}"
    return f"exec({source!r}, {{}})"


class WarmKernel:
    """A notebook's kernel, started in ``cwd`` with the warm-up sent: :meth:`ready` waits for it and hands
    the kernel manager to papermill; :meth:`shutdown` stops it (papermill does not own it, so it never does)."""

    def __init__(self, notebook: Path, kernel_name: str, cwd: Path, config, started=None):
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        self.notebook = notebook
        self.km = AsyncKernelManager(kernel_name=kernel_name, config=config)
        run_sync(self.km.start_kernel)(cwd=str(cwd))
        if started is not None:  # told the kernel's pid before anything waits on it (a kill may come at any time)
            started(getattr(self.km.provisioner, "pid", None))
        self._client = self.km.client()
        self._client.start_channels()
        self._msg_id = self._client.execute(warm_up_code(notebook), silent=True, store_history=False)
        self._waited = False
        self._lock = threading.Lock()

    def ready(self, timeout: float = 300.0):
        """Wait until the warm-up is done (its reply), close this side's channels; the kernel manager."""
        from jupyter_core.utils import run_sync

        with self._lock:  # one waiter per client: a second one would wait for a reply the first took
            if not self._waited:
                self._waited = True
                try:
                    run_sync(self._reply)(timeout)
                finally:
                    self._client.stop_channels()
        return self.km

    async def _reply(self, timeout: float) -> None:
        import time

        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return  # the kernel still works on it: papermill's cells queue behind it
            try:
                message = await self._client.get_shell_msg(timeout=left)
            except Exception:  # noqa: BLE001 - queue.Empty when it times out, a closed channel
                return
            if message.get("parent_header", {}).get("msg_id") == self._msg_id:
                return

    def shutdown(self) -> None:
        from jupyter_core.utils import run_sync

        try:
            with self._lock:
                if not self._waited:
                    self._waited = True
                    self._client.stop_channels()
            run_sync(self.km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001 - a kernel that is already gone needs no shutdown
            pass


class Exporters:
    """nbconvert's two HTML exporters (with code, without), made once and reused for every page: a new exporter
    builds a new Jinja environment and compiles the templates again."""

    def __init__(self, templates: Path):
        from nbconvert import HTMLExporter

        self.pages = {
            False: HTMLExporter(template_name="offline", extra_template_basedirs=[str(templates)]),
            True: HTMLExporter(
                exclude_input=True,
                exclude_input_prompt=True,
                exclude_output_prompt=True,
                template_name="offline",
                extra_template_basedirs=[str(templates)],
            ),
        }

    def warm(self) -> None:
        """Render a one-cell notebook with each: templates compiled, the highlighter and Markdown parser loaded."""
        import nbformat

        notebook = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_markdown_cell("# warm-up *page*"), nbformat.v4.new_code_cell("x = 1")],
            metadata={"language_info": {"name": "python", "pygments_lexer": "ipython3"}},
        )
        for exporter in self.pages.values():
            exporter.from_notebook_node(notebook)


#: A 1x1 PNG: the warm page's picture.
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def page_warm_up():
    """An executed notebook with a cell of each kind the pages show: a heading, text with a table, list and code,
    papermill's injected parameters, printed text, a picture with its alternative text, a table as HTML, an
    interactive figure's division, a value; rendered by :func:`driftscope.views.pages.warm_pages`."""
    import nbformat

    from .interactive import MARK

    v4 = nbformat.v4
    parameters = v4.new_code_cell('params_path = "p.yaml"\nreuse = True', execution_count=1)
    parameters.metadata["tags"] = ["injected-parameters"]
    figure = f'<div class="{MARK}" role="figure" aria-label="a"><div id="x"></div><script>var x = 1;</script></div>'
    table = "<style>#T_x td {color: red}</style><table id='T_x'><thead><tr><th>a</th></tr></thead>"
    table += "<tbody><tr><td>1</td></tr></tbody></table>"
    outputs = [
        v4.new_output("stream", name="stdout", text="printed\n"),
        v4.new_output(
            "display_data", data={"image/png": PIXEL, "text/plain": "a"}, metadata={"image/png": {"alt": "a"}}
        ),
        v4.new_output("display_data", data={"text/html": f'<div class="driftscope-table">{table}</div>'}),
        v4.new_output("display_data", data={"text/html": figure, "image/png": PIXEL, "text/plain": "a"}),
        v4.new_output("execute_result", data={"text/plain": "'a value'"}, execution_count=2),
    ]
    cells = [
        v4.new_markdown_cell(
            "# Warm-up\n\nText with `code`, *emphasis* and a [link](#x).\n\n- one\n- two\n\n"
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n## A section"
        ),  # fmt: skip
        parameters,
        v4.new_code_cell(
            "from driftscope.views import notebook\nnotebook.table(frame)", execution_count=2, outputs=outputs
        ),
    ]
    metadata = {"language_info": {"name": "python", "pygments_lexer": "ipython3"}}
    return v4.new_notebook(cells=cells, metadata=metadata)
