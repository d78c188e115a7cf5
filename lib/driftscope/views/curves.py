"""Error per stage, one curve per runtime pair, against the real per-stage tolerance.

The top panel is the share of its own tolerance each stage's worst element uses, ``|a - e| / (atol +
rtol * |e|)``: above the line at 1 an element fails. Every stage on the x axis is labelled, each pair has its
own marker (curves that lie on top of each other stay visible), and each pair's first divergence is marked.
What is drawn is what was measured (:mod:`driftscope.views.axes`): stages a pair did not compare are gaps, exact
equality has its own marker.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from driftscope.judge.rows import share_of_tolerance
from driftscope.run.report import Report

from .axes import COMPARED, UNCOMPARABLE, Series, count_axis, draw, legend_markers, log_range, series, stage_ticks, star
from .axes import stage_label as stage_label  # the short label, re-exported for the views that import it here
from .notebook import describe

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">"]
METRICS = {
    "tolerance_used": "share of tolerance used",
    "max_abs": "max |a - e|",
    "rms": "RMS error",
    "failures": "failing elements",
}
COUNTS = ("failures",)  # integer metrics: 0 is a value, drawn on a count axis


def first_divergences(report: Report) -> dict[str, str]:
    """Each pair's first divergent stage (pairs that do not diverge left out)."""
    first = report.data.get("first_divergence") or {}
    return {key: found["stage"] for key, found in first.items() if found and found.get("stage")}


def plotted_stages(report: Report) -> list[str]:
    """Stages on the x axis, in execution order: the float stages on the activation path (not integer ones,
    side inputs such as RoPE tables, or the processor's inputs) that some pair compared, and every stage that is a
    pair's first divergence (an exact stage such as an attention mask included: its star must show)."""
    compared = {row.stage for row in report.rows if row.status in (*COMPARED, *UNCOMPARABLE)}
    diverged = set(first_divergences(report).values())
    return [
        stage["id"]
        for stage in report.data.get("stage_plan", [])
        if stage["id"] in diverged
        or (
            stage["id"] in compared
            and not (stage.get("integer") or stage.get("side") or stage["id"].startswith("inputs."))
        )
    ]


def stage_blocks(report: Report) -> dict[str, int]:
    """Stage id -> its block number, for the stages of the plan that belong to a block."""
    return {s["id"]: s["block"] for s in report.data.get("stage_plan", []) if s.get("block") is not None}


def _value(row, metric: str) -> float | None:
    if row.integer and metric != "failures":  # an exact stage has no tolerance: equal ("="), else a mark on top
        return None if row.failed else 0.0
    if metric == "tolerance_used":
        return share_of_tolerance(row)
    value = getattr(row, metric)
    return None if value is None else float(value)


def pair_series(report: Report, key: str, stages: list[str], metric: str, rows=None) -> Series:
    """``key``'s values of ``metric`` over ``stages`` (gaps, exact and uncomparable stages as :func:`series`)."""
    rows = [r for r in (report.rows if rows is None else rows) if (r.pair or r.candidate) == key]
    return series(
        stages,
        rows,
        lambda r: _value(r, metric),
        lambda r: r.status,
        lambda r: r.stage,
        exact_zero=metric not in COUNTS,
    )


def error_curves(
    report: Report,
    metrics: tuple[str, ...] = ("tolerance_used", "max_abs", "failures"),
    height: float = 3.0,
    title: bool = True,
) -> Figure:
    """Per-stage error against execution order, one curve and marker per runtime pair: a gap where the pair did
    not compare a stage, "=" where it is exactly equal, the tolerance drawn where the metric has one (the range
    keeps headroom above it), counts on integer ticks, the stages grouped by block when there are many, and every
    pair's first divergence starred. ``title``: the figure's own title and the x axis's sentence (notebook 01's first
    screen has a heading, and its paragraph below says what the marks are)."""
    stages = plotted_stages(report)
    figure = Figure(figsize=(14, height * len(metrics) + 1.3), layout="constrained")
    axes = figure.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    diverged = first_divergences(report)
    pairs = report.pair_keys()
    every = report.rows  # parsed once
    xs = np.arange(len(stages), dtype=float)
    drawn: dict[str, list[Series]] = {metric: [] for metric in metrics}
    for index, key in enumerate(pairs):
        color, marker = COLORS[index % len(COLORS)], MARKERS[index % len(MARKERS)]
        divergence = diverged.get(key)
        for axis, metric in zip(axes, metrics, strict=True):
            shown = pair_series(report, key, stages, metric, every)
            drawn[metric].append(shown)
            size = 9 - 0.9 * (index % 6)  # nested hollow markers: pairs on top of each other stay visible
            draw(axis, xs, shown, color, marker, size, report.pair_title(key))
            if divergence in stages:
                at = stages.index(divergence)
                star(axis, xs[at], shown, at, color)
                axis.axvline(xs[at], color=color, linestyle="--", linewidth=1)
    for axis, metric in zip(axes, metrics, strict=True):
        axis.set_ylabel(METRICS.get(metric, metric))
        axis.grid(True, which="major", alpha=0.3)
        if metric in COUNTS:
            count_axis(axis, max([np.nanmax(s.values, initial=0.0) for s in drawn[metric]], default=0.0))
            continue
        axis.set_yscale("log")
        line = 1.0 if metric == "tolerance_used" else None
        axis.set_ylim(*log_range([s.values for s in drawn[metric]], line))
        legend_markers(axis, drawn[metric])
        if line:
            axis.axhline(1.0, color="black", linewidth=1.2, label="tolerance: atol + rtol·|e| (above: fails)")
            axis.set_title("worst element's |a - e| / (atol + rtol·|e|) per stage: above 1 it fails", fontsize=9)
    stage_ticks(axes, stages, stage_blocks(report))
    axes[-1].set_xlim(-0.7, len(stages) - 0.3)
    if title:
        axes[-1].set_xlabel(
            "stage, in execution order (★ and dashed line: a pair's first divergence; a gap: the pair did not "
            "compare it)"
        )
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0.0)
    if title:
        figure.suptitle(f"{report.data.get('name')}: error per stage, one curve per runtime pair", fontsize=11)
    marked = [f"{report.pair_title(key)}: {diverged[key]}" for key in pairs if diverged.get(key) in stages]
    verdict = "; ".join(marked) or "no pair diverges"
    return describe(
        figure,
        f"Error per stage ({', '.join(METRICS.get(m, m) for m in metrics)}) for {len(pairs)} runtime pairs against "
        f"{report.data.get('reference')}, {len(stages)} stages in execution order; first divergences: {verdict}.",
    )
