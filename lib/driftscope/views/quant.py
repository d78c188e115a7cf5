"""Quantized runs in notebook 02: which reference a candidate is closer to, stage by stage; the quantized
linears replayed fused and dequantized on the reference's input; what each runtime quantized.

Everything reads the report's ``attribution``, ``linear_replay`` and per-runtime ``quantization`` sections; a
report without them gives an empty section (a Markdown line saying so).
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from driftscope.core.markup import code, text
from driftscope.run.report import Report

from .plots import COLORS, block_outputs

LINEAR_COLUMNS = [
    "stage",
    "module",
    "stage_label",
    "label",
    "fused_vs_dequantized",
    "dequantized_vs_reference",
    "fused_vs_reference",
]


def attribution_figure(report: Report) -> Figure | None:
    """The candidate's relative RMS error to each reference per stage (log scale), blocks marked, verdict as title."""
    attribution = report.data.get("attribution") or {}
    rows = [row for row in attribution.get("rows", []) if all(np.isfinite(v) for v in row["errors"].values())]
    if not rows:
        return None
    references = list(attribution["references"])
    blocks = block_outputs(report)
    figure = Figure(figsize=(12, 4.2), layout="constrained")
    axis = figure.subplots()
    from .axes import from_numbers, legend_markers, log_range, markers

    xs = np.arange(len(rows))
    shown = []
    for color, reference in zip(COLORS, references, strict=False):
        drawn = from_numbers(row["errors"][reference] for row in rows)  # 0: exactly equal, a marker, not 1e-9
        shown.append(drawn)
        axis.plot(xs, drawn.values, marker=".", linewidth=1, color=color, label=f"to {reference}")
        markers(axis, xs, drawn, color)
        nearer = [i for i, row in enumerate(rows) if row["closer"] == reference]
        axis.scatter(nearer, drawn.values[nearer], s=30, facecolors="none", edgecolors=color, zorder=3)
    legend_markers(axis, shown)
    ticks = [i for i, row in enumerate(rows) if row["stage"] in blocks]
    for tick in ticks:
        axis.axvline(tick, color="#dddddd", linewidth=0.8, zorder=0)
    axis.set_xticks(ticks, [f"b{rows[i]['stage'].rsplit('.', 1)[-1]}" for i in ticks])
    axis.set_yscale("log")
    axis.set_ylim(*log_range([d.values for d in shown]))
    axis.set_ylabel(f"relative RMS of {attribution['candidate']}")
    axis.set_xlabel("stages in execution order (circles: the nearer reference; grey lines: block outputs)")
    axis.legend(loc="upper left", fontsize=8)
    axis.set_title("\n".join(textwrap.wrap(attribution["verdict"], 110)), fontsize=9)
    return figure


def linear_replay_frame(report: Report, label: str | None = None):
    """The quantized linears replayed fused and dequantized (one candidate, or every one with a ``candidate``)."""
    import pandas as pd

    entries = report.data.get("linear_replay") or {}
    chosen = {label: entries[label]} if label in entries else ({} if label else entries)
    frames = [pd.DataFrame(entry["rows"]).assign(candidate=name) for name, entry in chosen.items() if entry["rows"]]
    if not frames:
        return pd.DataFrame(columns=["candidate", *LINEAR_COLUMNS])
    frame = pd.concat(frames, ignore_index=True)
    if "stage_label" in frame:  # a stage the replay did not label (the rows stand without it)
        frame["stage_label"] = frame["stage_label"].fillna("not replayed")
    return frame[["candidate", *[column for column in LINEAR_COLUMNS if column in frame]]]


def quantization_frame(report: Report):
    """What each quantized runtime ran: source, bits, group size, execution, activations, layers, left dense."""
    import pandas as pd

    rows = []
    for runtime in report.data.get("runtimes", []):
        quantization = runtime.get("quantization")
        if not quantization:
            continue
        rows.append(
            {
                "runtime": runtime["label"],
                "source": quantization.get("source"),
                "bits": quantization.get("bits"),
                "group_size": quantization.get("group_size"),
                "execution": quantization.get("execution"),
                "activations": quantization.get("activations"),
                "quantized": ", ".join(f"{k} {v}" for k, v in sorted((quantization.get("quantized") or {}).items())),
                "left_dense": len(quantization.get("left_dense") or []),
            }
        )
    return pd.DataFrame(rows)


def quantized_items(report: Report) -> list[Any]:
    """Notebook 02's quantized section, in order: Markdown lines, the attribution figure, the tables (styled as
    the notebooks' other tables)."""
    from IPython.display import Markdown

    runtimes = quantization_frame(report)
    if runtimes.empty and not report.data.get("attribution"):
        return [Markdown("No quantized runtime and no attribution in this run.")]
    from .notebook import table

    items: list[Any] = [table(runtimes, highlight=None)] if not runtimes.empty else []
    left = [
        (runtime["label"], layer)
        for runtime in report.data.get("runtimes", [])
        for layer in (runtime.get("quantization") or {}).get("left_dense") or []
    ]
    if left:
        lines = [f"- {code(name)}: {code(layer['name'])} stays dense: {text(layer['reason'])}" for name, layer in left]
        items.append(Markdown("**Layers left dense**\n\n" + "\n".join(lines)))
    attribution = report.data.get("attribution")
    if attribution:
        items.append(Markdown(f"**Closer-to attribution**: {text(attribution['verdict'])}"))
        figure = attribution_figure(report)
        if figure is not None:
            items.append(figure)
    from .finding import quantized_mechanism

    for label, entry in (report.data.get("linear_replay") or {}).items():  # the module named as the banner names it
        said = quantized_mechanism(report, label) or text(entry["verdict"])
        items.append(Markdown(f"**Same-input linear replay**, {code(label)}: {said}"))
    frame = linear_replay_frame(report)
    if not frame.empty:
        items.append(table(frame, highlight=None))
    return items
