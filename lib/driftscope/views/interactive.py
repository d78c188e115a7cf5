"""Interactive evidence: the error curves and the channel map as plotly figures, with hover values.

Each view returns an :class:`Interactive`, whose display bundle carries three forms of the same figure:
plotly's own (JupyterLab draws it with its plotly extension), an HTML ``div`` for the rendered pages (the page
gets plotly.js inlined once, by :func:`page_with_plotly`, so it stays self-contained and opens offline) and a
static PNG with alternative text (the matplotlib figure; the README's pictures, and every page whose interactive
form would pass :data:`PAGE_BUDGET`).
"""

from __future__ import annotations

import base64
import html
import json
import math

import numpy as np

from driftscope.core.markup import html_text
from driftscope.run.report import Report

from .axes import COMPARED, GROUPED_AT, UNCOMPARABLE, log_range, stage_groups, stage_label
from .curves import COLORS, METRICS, error_curves, first_divergences, pair_series, plotted_stages, stage_blocks
from .errormaps import StageDifference
from .notebook import alt_text

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
MARK = "driftscope-plotly"  # the class of each interactive figure's div in a page
PAGE_BUDGET = 12 * 1024 * 1024  # bytes: a page over it with plotly.js inlined (~4.8 MB) shows the static PNGs
MAP_CELLS = 16_384  # a channel map with more cells is max-pooled to about this many (the worst element kept)
SYMBOLS = ["circle-open", "square-open", "triangle-up-open", "diamond-open", "triangle-down-open", "cross-open"]


class Interactive:
    """A plotly figure with its static fallback (a matplotlib figure) and alternative text."""

    def __init__(self, figure, fallback, alt: str | None = None):
        self.figure, self.fallback = figure, fallback
        self.alt = alt or alt_text(fallback)  # fallback None: no static form (shown in the lab only)

    def html(self) -> str:
        import plotly.io as pio

        height = int(self.figure.layout.height or 450)
        div = pio.to_html(
            self.figure,
            include_plotlyjs=False,
            full_html=False,
            default_height=f"{height}px",
            config={"displaylogo": False, "responsive": True},
        )
        return f'<div class="{MARK}" role="figure" aria-label="{html.escape(self.alt)}">{div}</div>'

    def _repr_mimebundle_(self, include=None, exclude=None):
        from IPython.core.pylabtools import print_figure

        png = base64.b64encode(print_figure(self.fallback, "png", bbox_inches="tight")).decode("ascii")
        from .figure_facts import facts_json

        data = {
            PLOTLY_MIME: json.loads(self.figure.to_json()),
            "text/html": self.html(),
            "image/png": png,
            "text/plain": self.alt,
        }
        return data, {"image/png": {"alt": self.alt, "figure": facts_json(self.fallback, drawn=True)}}


def _g(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


def _element(row) -> str:
    """The row's element to look at, for a hover label: the worst failing one, else the largest difference."""
    worst = row.first_nonfinite or row.worst_failing
    coords, expected, actual = (
        (worst["coords"], worst["reference"], worst["candidate"])
        if worst
        else (row.max_coords, row.max_reference_value, row.max_candidate_value)
    )
    if coords is None:
        return "none (no difference)" if not row.max_abs else "not recorded"
    where = f"({', '.join(map(str, coords))})" if isinstance(coords, list | tuple) else str(coords)
    return f"{where}: expected {_g(expected)}, actual {_g(actual)}"


def _absent(stage: str, title: str, row) -> list[str]:
    why = f" ({row.note or row.status})" if row is not None else ""
    return [stage, title, "", "", "", f"not compared{why}"]


def _hover(row, title: str) -> list[str]:
    from driftscope.judge.rows import share_of_tolerance

    if row.status not in (*COMPARED, *UNCOMPARABLE):
        return _absent(row.stage, title, row)

    return [row.stage, title, _g(row.max_abs), _g(share_of_tolerance(row)), str(row.failures), _element(row)]


HOVER = (
    "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>max |a - e|: %{customdata[2]}<br>"
    "tolerance used: %{customdata[3]}<br>failing elements: %{customdata[4]}<br>worst element %{customdata[5]}"
    "<extra></extra>"
)


def error_curves_figure(
    report: Report, metrics=("tolerance_used", "max_abs", "failures"), height: int = 260, static: bool = True
):
    """The interactive form of :func:`~driftscope.views.curves.error_curves`: the same values, gaps, markers and
    stars; hovering a point gives its stage, pair, max |a - e|, tolerance used and worst element. ``static``:
    build the PNG fallback too (the lab's explorer, which shows plotly's own form, does not need it)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stages = plotted_stages(report)
    xs = list(range(len(stages)))
    figure = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.04)
    every, diverged = report.rows, first_divergences(report)
    drawn_by = {m: {k: pair_series(report, k, stages, m, every) for k in report.pair_keys()} for m in metrics}
    values_by = {metric: [s.values for s in drawn_by[metric].values()] for metric in metrics}
    for index, key in enumerate(report.pair_keys()):
        title, color = report.pair_title(key), COLORS[index % len(COLORS)]
        by_stage = {r.stage: r for r in every if (r.pair or r.candidate) == key}
        hover = [_hover(by_stage[s], title) if s in by_stage else _absent(s, title, None) for s in stages]
        for number, metric in enumerate(metrics, start=1):
            drawn = drawn_by[metric][key]
            values = [None if not np.isfinite(v) else float(v) for v in drawn.values]
            figure.add_trace(
                go.Scatter(x=xs, y=values, mode="lines+markers", name=title, legendgroup=key, showlegend=number == 1,
                           line={"color": color, "width": 1}, connectgaps=False, customdata=hover,
                           hovertemplate=HOVER, marker={"symbol": SYMBOLS[index % len(SYMBOLS)], "size": 8}),
                row=number, col=1,
            )  # fmt: skip
            low, high = _range(metric, values_by[metric])
            for mask, y, symbol, said in ((drawn.exact, low, "line-ew-open", "exactly equal"),
                                          (drawn.over, high, "triangle-up", "fails with no finite value")):  # fmt: skip
                if mask.any():
                    at = np.flatnonzero(mask)
                    figure.add_trace(
                        go.Scatter(x=[xs[i] for i in at], y=[y] * len(at), mode="markers", legendgroup=key,
                                   showlegend=False, name=f"{title}: {said}", customdata=[hover[i] for i in at],
                                   hovertemplate=f"{said}<br>" + HOVER,
                                   marker={"symbol": symbol, "size": 12, "color": color, "line": {"width": 2}}),
                        row=number, col=1,
                    )  # fmt: skip
            if diverged.get(key) in stages:
                at = stages.index(diverged[key])
                y = values[at] if values[at] is not None else (low if drawn.exact[at] else high)
                figure.add_trace(
                    go.Scatter(x=[at], y=[y], mode="markers", legendgroup=key, showlegend=False,
                               name=f"{title}: first divergence", customdata=[hover[at]],
                               hovertemplate="first divergence<br>" + HOVER,
                               marker={"symbol": "star", "size": 18, "color": color}),
                    row=number, col=1,
                )  # fmt: skip
    _axes(figure, report, stages, metrics, values_by)
    figure.update_layout(
        height=height * len(metrics) + 120,
        margin={"l": 70, "r": 20, "t": 40, "b": 130},
        hovermode="closest",
        template="simple_white",
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0, "font": {"size": 10}},
    )
    if not static:
        return Interactive(figure, None, "Error per stage, interactive.")
    fallback = error_curves(report, metrics=metrics, height=2.4)
    return Interactive(figure, fallback, "Interactive: " + alt_text(fallback))


def _range(metric: str, values: list[np.ndarray]) -> tuple[float, float]:
    """Where a panel's exact and no-value markers sit: its bottom and top (log) or 0 and the headroom (count)."""
    if metric == "failures":
        high = max([float(np.nanmax(v, initial=0.0)) for v in values] + [1.0])
        return 0.0, high * 1.2
    bottom, top = log_range(values, 1.0 if metric == "tolerance_used" else None)
    return bottom * 2, top / 2


def _axes(figure, report: Report, stages: list[str], metrics, values_by: dict) -> None:
    blocks = stage_blocks(report)
    grouped = len(stages) > GROUPED_AT and blocks
    labels, spans = stage_groups(stages, blocks) if grouped else ([stage_label(s) for s in stages], [])
    for number, metric in enumerate(metrics, start=1):
        figure.update_yaxes(title_text=METRICS.get(metric, metric), row=number, col=1, showgrid=True)
        if metric == "failures":
            high = max([float(np.nanmax(v, initial=0.0)) for v in values_by[metric]] + [1])
            figure.update_yaxes(tickformat=",d", rangemode="tozero", range=[-0.5, high * 1.25 + 0.5], row=number,
                                col=1, dtick=max(1, math.ceil(high / 8)))  # fmt: skip
            continue
        line = 1.0 if metric == "tolerance_used" else None
        bottom, top = log_range(values_by[metric], line)
        figure.update_yaxes(type="log", range=[math.log10(bottom), math.log10(top)], exponentformat="power",
                            row=number, col=1)  # fmt: skip
        if line:
            figure.add_hline(y=1.0, line={"color": "black", "width": 1.2}, row=number, col=1,
                             annotation_text="tolerance (above: fails)", annotation_position="top left")  # fmt: skip
    figure.update_xaxes(tickmode="array", tickvals=list(range(len(stages))), ticktext=labels, tickangle=-90,
                        tickfont={"size": 9}, range=[-0.7, len(stages) - 0.3])  # fmt: skip
    for number, (block, start, stop, named) in enumerate(spans):  # runs of one block's stages (stage_groups)
        if number % 2 == 0:  # alternate shading: where one block ends and the next begins
            figure.add_vrect(x0=start - 0.5, x1=stop + 0.5, fillcolor="#000000", opacity=0.06, line_width=0)
        if named:
            figure.add_annotation(x=(start + stop) / 2, y=1.0, xref="x", yref="y domain", text=f"block {block}",
                                  showarrow=False, yanchor="bottom", font={"size": 9})  # fmt: skip


def channel_map_figure(difference: StageDifference, fallback=None) -> Interactive:
    """|actual - expected| as tokens x channels (log colour), one panel per image; hovering a cell gives the
    token, the channel, both values and the difference (cells max-pooled past :data:`MAP_CELLS`, the worst
    element of each kept). Exactly equal elements are left blank."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from .drill import channel_map

    panels = difference.image_rows
    figure = make_subplots(rows=1, cols=len(panels), subplot_titles=[f"image {n}" for n in range(len(panels))])
    diff = np.nan_to_num(difference.diff, nan=np.inf)
    positive = diff[np.isfinite(diff) & (diff > 0)]
    low = float(np.quantile(positive, 0.01)) if positive.size else 1e-9
    high = float(positive.max()) if positive.size else 1.0
    for number, (start, stop) in enumerate(panels, start=1):
        part, expected, actual = (m[start:stop] for m in (diff, difference.expected, difference.actual))
        step_t, step_c = _steps(part.shape)
        tokens, channels, worst = _pool(part, step_t, step_c)
        value = diff[start:stop][tokens, channels]
        shown = np.where(value > 0, np.log10(np.maximum(value, low)), np.nan)
        custom = np.stack(
            [tokens + start, channels, expected[tokens, channels], actual[tokens, channels], value], axis=-1
        )
        figure.add_trace(
            go.Heatmap(z=shown.astype(np.float32), x=np.arange(worst.shape[1]) * step_c,
                       y=np.arange(worst.shape[0]) * step_t,
                       customdata=_significant(custom).astype(np.float32), colorscale="Magma", zmin=math.log10(low),
                       zmax=math.log10(max(high, low * 10)), showscale=number == len(panels),
                       colorbar={"title": {"text": "log10 |a - e|"}},
                       hovertemplate="token %{customdata[0]:d}, channel %{customdata[1]:d}<br>expected "
                       "%{customdata[2]:.4g}<br>actual %{customdata[3]:.4g}<br>|a - e| %{customdata[4]:.4g}"
                       "<extra></extra>"),
            row=1, col=number,
        )  # fmt: skip
        figure.update_yaxes(autorange="reversed", title_text=f"token ({difference.token_order} order)", row=1,
                            col=number)  # fmt: skip
        figure.update_xaxes(title_text="channel", row=1, col=number)
    pooled = " (max-pooled: each cell its block's worst element)" if _steps(diff.shape) != (1, 1) else ""
    figure.update_layout(
        height=460,
        title={
            "text": html_text(f"{difference.stage}: |a - e| per token and channel{pooled}; blank: exactly equal"),
            "font": {"size": 12},
        },
        template="simple_white",
        margin={"l": 70, "r": 20, "t": 60, "b": 50},
    )
    fallback = None if fallback is False else fallback if fallback is not None else channel_map(difference)
    return Interactive(figure, fallback, f"Interactive channel map of {difference.stage}: |a - e| per token and "
                                          "channel, hover for both values.")  # fmt: skip


def _significant(values: np.ndarray, digits: int = 4) -> np.ndarray:
    """``values`` rounded to ``digits`` significant digits (the page's JSON stays small; hover shows 4)."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(values != 0, 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(values)))), 1.0)
        return np.where(np.isfinite(scale), np.round(values * scale) / scale, values)


def _steps(shape: tuple[int, int]) -> tuple[int, int]:
    rows, columns = shape
    factor = math.sqrt(rows * columns / MAP_CELLS)
    if factor <= 1:
        return 1, 1
    return max(1, math.ceil(rows / max(1, round(rows / factor)))), max(
        1, math.ceil(columns / max(1, round(columns / factor)))
    )


def _pool(part: np.ndarray, step_t: int, step_c: int):
    """(token index, channel index, value) of the worst element of each step_t x step_c block of ``part``."""
    rows, columns = part.shape
    pad = np.full((math.ceil(rows / step_t) * step_t, math.ceil(columns / step_c) * step_c), -1.0)
    pad[:rows, :columns] = np.where(np.isfinite(part), part, np.finfo(np.float64).max)
    blocks = pad.reshape(pad.shape[0] // step_t, step_t, pad.shape[1] // step_c, step_c).transpose(0, 2, 1, 3)
    flat = blocks.reshape(blocks.shape[0], blocks.shape[1], -1)
    best = flat.argmax(axis=-1)
    block_t, block_c = np.indices(best.shape)
    tokens = np.minimum(block_t * step_t + best // step_c, rows - 1)
    channels = np.minimum(block_c * step_c + best % step_c, columns - 1)
    return tokens, channels, flat.max(axis=-1)


def page_ready(notebook) -> tuple[object, bool]:
    """A notebook as a page shows it: widgets (live in JupyterLab only) give way to what they say in words, and
    interactive figures keep their HTML form when the page with plotly.js inlined stays under
    :data:`PAGE_BUDGET`, else show their static PNG. Returns (the notebook, whether to inline plotly.js)."""
    import copy

    shown = copy.deepcopy(notebook)
    shown.metadata.pop("widgets", None)  # the widgets' saved state: the page would fetch their manager from a CDN
    outputs = [o for c in shown.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    for output in outputs:
        data = output.get("data", {})
        if WIDGET_MIME in data and ("text/html" in data or "text/plain" in data):
            data.pop(WIDGET_MIME)
    marked = [o for o in outputs if MARK in str(o.get("data", {}).get("text/html", ""))]
    if not marked:
        return shown, False
    size = sum(len(json.dumps(o.get("data", {}))) for o in outputs) + len(_plotly_js())
    if size <= PAGE_BUDGET:
        return shown, True
    for output in marked:
        output["data"].pop("text/html")
        output["data"].pop(PLOTLY_MIME, None)
    return shown, False


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def page_with_plotly(body: str) -> str:
    """``body`` (a rendered page) with plotly.js inlined once in its head."""
    script = f'<script type="text/javascript">window.PlotlyConfig = {{MathJaxConfig: "local"}};</script>' \
             f'<script type="text/javascript">{_plotly_js()}</script>'  # fmt: skip
    return body.replace("</head>", script + "\n</head>", 1)
