"""The interactive forms of notebook 06's KV-cache map and margin plot (notebook 07's probes: ``views.precision``):
plotly figures with the values under the cursor, each with its matplotlib figure as the static fallback
(:class:`~driftscope.views.interactive.Interactive`: a page over the size budget shows the PNG)."""

from __future__ import annotations

import numpy as np

from driftscope.run.report import Report

from .cache import COLUMNS, _cache_pairs, _errors, cache_heatmap
from .interactive import SYMBOLS, Interactive
from .notebook import alt_text


def cache_map_figure(report: Report, phase: str = "forced") -> Interactive:
    """Per pair, each decoder layer's (rows, one tick per layer) and head's (columns: keys, then values) relative
    L-inf error of the ``phase`` cache, log colour; hover a cell for the layer, head, its error and whether it
    breaks the contract. Exactly equal cells are blank."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pairs = [pair for pair in _cache_pairs(report) if _errors(pair["cache"], phase) is not None]
    columns = min(max(len(pairs), 1), COLUMNS)
    rows = -(-max(len(pairs), 1) // columns)
    titles = [f"{pair['candidate']} vs {pair['reference']}" for pair in pairs]
    figure = make_subplots(rows=rows, cols=columns, subplot_titles=titles or ["no cache compared"])
    for index, pair in enumerate(pairs):
        errors = _errors(pair["cache"], phase)
        heads = errors.shape[1] // 2
        names = [f"k{h}" for h in range(heads)] + [f"v{h}" for h in range(heads)]
        breaks = np.zeros(errors.shape, dtype=bool)
        for kind_index, kind in enumerate(("keys", "values")):
            for layer in pair["cache"]["stages"][f"text.cache.{phase}.{kind}"]["layers"]:
                for head in layer["heads"]:
                    breaks[layer["layer"], kind_index * heads + head["head"]] = head["first_position"] is not None
        with np.errstate(divide="ignore"):
            shown = np.where(errors > 0, np.log10(np.maximum(errors, 1e-8)), np.nan)
        custom = np.stack(
            [np.broadcast_to(np.arange(errors.shape[0])[:, None], errors.shape), errors, breaks.astype(float)], -1
        )
        row, column = divmod(index, columns)
        figure.add_trace(
            go.Heatmap(z=shown, x=names, y=list(range(errors.shape[0])), customdata=custom, colorscale="Magma",
                       zmin=-8, zmax=0, showscale=index == 0, colorbar={"title": {"text": "log10 rel. L-inf"}},
                       hovertemplate="layer %{customdata[0]:d}, head %{x}<br>relative L-inf %{customdata[1]:.3g}"
                       "<br>breaks the contract: %{customdata[2]:d}<extra></extra>"),
            row=row + 1, col=column + 1,
        )  # fmt: skip
        figure.update_yaxes(title_text="layer", dtick=1, tickformat="d", autorange="reversed", row=row + 1,
                            col=column + 1)  # fmt: skip
        figure.update_xaxes(title_text="head (k: keys, v: values)", row=row + 1, col=column + 1)
    title = f"The {phase} KV cache: relative L-inf error per layer and head; blank: exactly equal"
    figure.update_layout(height=80 + 300 * rows, template="simple_white", margin={"l": 60, "r": 20, "t": 60, "b": 50},
                         title={"text": title, "font": {"size": 12}})  # fmt: skip
    fallback = cache_heatmap(report, phase)
    return Interactive(figure, fallback, "Interactive: " + alt_text(fallback))


def margins_figure(report: Report) -> Interactive:
    """Top-1 minus top-2 logit at each generated step, one line per runtime, the first differing step of each pair
    dashed; hover for the step, the runtime, its margin and its token."""
    import plotly.graph_objects as go

    from .answer import margin_plot

    answer = report.data.get("answer") or {}
    figure = go.Figure()
    for index, (label, entry) in enumerate(answer.get("runtimes", {}).items()):
        steps = list(range(len(entry["margins"])))
        tokens = list(entry.get("tokens") or [None] * len(steps))[: len(steps)]
        figure.add_trace(
            go.Scatter(x=steps, y=entry["margins"], mode="lines+markers", name=label, customdata=tokens,
                       marker={"symbol": SYMBOLS[index % len(SYMBOLS)], "size": 10 - index % 6},
                       line={"dash": ["solid", "dash", "dot", "dashdot"][index % 4], "width": 1},
                       hovertemplate=f"{label}<br>step %{{x}}: margin %{{y:.4g}}, token %{{customdata}}"
                       "<extra></extra>"),
        )  # fmt: skip
    for pair in answer.get("pairs", []):
        if pair["first_difference"] is not None:
            figure.add_vline(x=pair["first_difference"], line={"color": "#d62728", "dash": "dash", "width": 1})
    figure.update_xaxes(title_text="generated step", dtick=1, tickformat="d")
    figure.update_yaxes(title_text="top-1 minus top-2 logit")
    figure.update_layout(height=360, template="simple_white", hovermode="closest",
                         title={"text": "logit margin along the greedy sequence (dashed: first differing token)",
                                "font": {"size": 12}})  # fmt: skip
    fallback = margin_plot(report)
    return Interactive(figure, fallback, "Interactive: " + alt_text(fallback))
