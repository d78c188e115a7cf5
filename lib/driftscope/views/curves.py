"""Error per stage, one curve per runtime pair, against the real per-stage tolerance.

The top panel is the share of its own tolerance each stage's worst element uses, ``|a - e| / (atol +
rtol * |e|)``: above the line at 1 an element fails. Every stage on the x axis is labelled, each pair has its
own marker (curves that lie on top of each other stay visible), and each pair's first divergence is marked.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from driftscope.judge.rows import share_of_tolerance
from driftscope.run.report import Report

from .notebook import describe

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">"]
FLOOR = 1e-9  # log axes: zero is drawn here
METRICS = {
    "tolerance_used": "share of tolerance used",
    "max_abs": "max |a - e|",
    "rms": "RMS error",
    "failures": "failures + 1",
}


def stage_label(stage_id: str, tower: str = "vision") -> str:
    """A short x-axis label: ``vision.block.3.attn.q`` -> ``b3.attn.q``, ``vision.patch_embed`` -> ``patch_embed``."""
    parts = stage_id.split(".")
    if parts[0] == tower:
        parts = parts[1:]
    if len(parts) >= 2 and parts[0] == "block" and parts[1].isdigit():
        parts = [f"b{parts[1]}", *parts[2:]]
    return ".".join(parts) or stage_id


def plotted_stages(report: Report) -> list[str]:
    """Stages on the x axis, in execution order: the float stages on the activation path (not integer ones,
    side inputs such as RoPE tables, or the processor's inputs) that some pair compared."""
    compared = {row.stage for row in report.rows if row.status in ("pass", "fail")}
    return [
        stage["id"]
        for stage in report.data.get("stage_plan", [])
        if stage["id"] in compared
        and not (stage.get("integer") or stage.get("side") or stage["id"].startswith("inputs."))
    ]


def _value(row, metric: str) -> float:
    if metric == "tolerance_used":
        return share_of_tolerance(row)
    if metric == "failures":
        return float(row.failures) + 1.0
    return float(getattr(row, metric))


def error_curves(
    report: Report,
    metrics: tuple[str, ...] = ("tolerance_used", "max_abs", "failures"),
    height: float = 3.0,
    title: bool = True,
) -> Figure:
    """Per-stage error against execution order (log scale), one curve and marker per runtime pair, the
    tolerance drawn where the metric has one, every stage labelled, each pair's first divergence starred.
    ``title``: the figure's own title (the first screen of notebook 01 has its heading instead)."""
    stages = plotted_stages(report)
    position = {stage: index for index, stage in enumerate(stages)}
    figure = Figure(figsize=(14, height * len(metrics) + 1.3), layout="constrained")
    axes = figure.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    first = report.data.get("first_divergence") or {}
    pairs = report.pair_keys()
    every = report.rows  # parsed once
    marked = []
    for index, key in enumerate(pairs):
        color, marker = COLORS[index % len(COLORS)], MARKERS[index % len(MARKERS)]
        rows = sorted(
            (r for r in every if (r.pair or r.candidate) == key and r.stage in position),
            key=lambda r: position[r.stage],
        )
        rows = [r for r in rows if r.status in ("pass", "fail")]
        xs = np.array([position[r.stage] for r in rows])
        divergence = (first.get(key) or {}).get("stage")
        for axis, metric in zip(axes, metrics, strict=True):
            ys = np.array([_value(r, metric) for r in rows], dtype=float)
            shown = np.clip(np.nan_to_num(ys, nan=FLOOR, posinf=1e9), FLOOR, 1e9)
            axis.plot(
                xs,
                shown,
                color=color,
                linewidth=1.0,
                alpha=0.85,
                marker=marker,
                markersize=9 - 0.9 * (index % 6),  # nested hollow markers: pairs on top of each other stay visible
                markerfacecolor="none",
                markeredgewidth=1.1,
                label=report.pair_title(key),
            )
            if divergence in position:
                at = [i for i, r in enumerate(rows) if r.stage == divergence]
                if at:
                    axis.plot(position[divergence], shown[at[0]], marker="*", markersize=16, color=color, zorder=5)
                axis.axvline(position[divergence], color=color, linestyle="--", linewidth=1)
        if divergence in position:
            marked.append(f"{report.pair_title(key)}: {divergence}")
    for axis, metric in zip(axes, metrics, strict=True):
        axis.set_yscale("log")
        axis.set_ylabel(METRICS.get(metric, metric))
        axis.grid(True, which="major", alpha=0.3)
        if metric == "tolerance_used":
            axis.axhline(1.0, color="black", linewidth=1.2, label="tolerance: atol + rtol·|e| (above: fails)")
            axis.set_title("worst element's |a - e| / (atol + rtol·|e|) per stage: above 1 it fails", fontsize=9)
    axes[-1].set_xticks(range(len(stages)), [stage_label(s) for s in stages], rotation=90, fontsize=7)
    axes[-1].set_xlim(-0.7, len(stages) - 0.3)
    axes[-1].set_xlabel("stage, in execution order (★ and dashed line: a pair's first divergence)")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0.0)
    if title:
        figure.suptitle(f"{report.data.get('name')}: error per stage, one curve per runtime pair", fontsize=11)
    verdict = "; ".join(marked) or "no pair diverges"
    return describe(
        figure,
        f"Error per stage ({', '.join(METRICS.get(m, m) for m in metrics)}) for {len(pairs)} runtime pairs against "
        f"{report.data.get('reference')}, {len(stages)} stages in execution order; first divergences: {verdict}.",
    )
