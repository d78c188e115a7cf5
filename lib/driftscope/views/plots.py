"""Figures the notebooks show. Each returns a matplotlib Figure built without pyplot's global state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from driftscope.run.report import Report

from .curves import error_curves  # noqa: F401 - the notebooks' import of it

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]


def _stage_axis(report: Report, activations_only: bool = False) -> tuple[list[str], dict[str, int]]:
    """Stage ids in execution order (optionally only activation-path float stages) and their positions."""
    ordered = [
        stage["id"]
        for stage in report.data.get("stage_plan", [])
        if not activations_only or not (stage.get("integer") or stage.get("side") or stage["id"].startswith("inputs."))
    ]
    return ordered, {stage_id: position for position, stage_id in enumerate(ordered)}


def landmarks(report: Report) -> list[str]:
    """Stages the family marks as landmarks of its plan (e.g. the embedding and the tower's output)."""
    return list(report.data.get("plan_meta", {}).get("landmarks", []))


def block_outputs(report: Report) -> set[str]:
    """Stage ids of block outputs (a block number, no substage), from the report's stage plan."""
    return {s["id"] for s in report.data.get("stage_plan", []) if s.get("block") is not None and not s.get("substage")}


def _block_ticks(report: Report, ordered: list[str]) -> tuple[list[int], list[str]]:
    blocks = {s["id"]: s["block"] for s in report.data.get("stage_plan", []) if s["id"] in block_outputs(report)}
    marks = set(landmarks(report))
    ticks, labels = [], []
    for position, stage_id in enumerate(ordered):
        if stage_id in blocks:
            ticks.append(position)
            labels.append(f"b{blocks[stage_id]}")
        elif stage_id in marks:
            ticks.append(position)
            labels.append(stage_id.split(".", 1)[-1])
    return ticks, labels


def input_images(report: Report) -> Figure:
    """The input images as the processor resized them, with the family's overlay (e.g. its attention-window
    grid) drawn over and its caption."""
    from PIL import Image

    from ..families import get_family
    from ..inputs.rgb import to_rgb

    inputs = report.data.get("inputs", {})
    paths = inputs.get("images", [])
    overlay = get_family(report.data["family"]).view_hooks().input_overlay
    figure = Figure(figsize=(3.2 * max(len(paths), 1), 3.4), layout="constrained")
    axes = figure.subplots(1, max(len(paths), 1), squeeze=False)[0]
    for index, (axis, path, size) in enumerate(zip(axes, paths, inputs.get("resized", []), strict=False)):
        height, width = size
        with Image.open(path) as image:  # RGB as the processor made it (transparency onto white)
            axis.imshow(np.asarray(to_rgb(image).resize((width, height))))
        step, caption = overlay(inputs, index)
        for x in range(step, width, step) if step else ():
            axis.axvline(x, color="white", linewidth=0.8)
        for y in range(step, height, step) if step else ():
            axis.axhline(y, color="white", linewidth=0.8)
        axis.set_title(f"{Path(path).name}\n{caption}", fontsize=8)
        axis.set_axis_off()
    return figure


def _pairs_failing_first(report: Report, status_columns: list[str]) -> list[str]:
    """The table's pairs, failing ones first, each group in the report's order (then any the report lacks)."""
    present = [column.removesuffix(" status") for column in status_columns]
    per_pair = (report.data.get("verdict") or {}).get("per_candidate") or {}
    ordered = [key for key in report.pair_keys() if key in present] + [
        p for p in present if p not in report.pair_keys()
    ]
    return sorted(ordered, key=lambda key: per_pair.get(key, "pass") == "pass")


def stage_table(report: Report, only_failing: bool = False):
    """Stage x runtime-pair table of status, max_abs and failures (a pandas Styler, failures in red); a pair some
    of whose stages were judged by a bound derived from the arithmetic (``judge.bounds``) gets a column naming the
    bound of each such stage."""
    import pandas as pd

    frame = report.frame()
    if frame.empty:
        return frame
    compared = frame["status"].isin(("pass", "fail", "shape_mismatch", "layout_mismatch"))
    frame["failures"] = frame["failures"].where(compared)  # a stage not compared has no failure count, not 0
    ordered, position = _stage_axis(report)
    frame["order"] = frame["stage"].map(position)
    wide = frame.pivot_table(index=["order", "stage"], columns="pair", values=["max_abs", "failures"], aggfunc="first")
    status = frame.pivot_table(index=["order", "stage"], columns="pair", values="status", aggfunc="first")
    names = {"max_abs": "max |a - e|", "failures": "failures"}
    wide.columns = [f"{candidate} {names[metric]}" for metric, candidate in wide.columns]
    status.columns = [f"{candidate} status" for candidate in status.columns]
    parts = [status, wide]
    derived = frame[frame["bound"].fillna("contract") != "contract"]
    if not derived.empty:
        bounds = derived.pivot_table(index=["order", "stage"], columns="pair", values="bound", aggfunc="first")
        bounds.columns = [f"{candidate} bound" for candidate in bounds.columns]
        parts.append(bounds)
    table = pd.concat(parts, axis=1).droplevel("order")
    table = table[
        [
            f"{pair} {metric}"
            for pair in _pairs_failing_first(report, list(status.columns))
            for metric in ("status", names["max_abs"], "failures", "bound")
            if f"{pair} {metric}" in table.columns
        ]
    ]
    table.index.name = None  # the stage ids are the rows' headers: no "stage" index header above them
    if only_failing:
        table = table[(status != "pass").any(axis=1).to_numpy()]

    def highlight(value):
        return "background-color: #f8d0d0" if value in ("fail", "shape_mismatch", "layout_mismatch") else ""

    formats = {column: "{:.3g}" for column in table.columns if column.endswith(names["max_abs"])}
    formats.update({column: "{:.0f}" for column in table.columns if column.endswith("failures")})
    # a Styler writes labels raw into its HTML: every value, stage id and runtime label is escaped
    return (
        table.style.map(highlight)
        .format(na_rep="", escape="html")
        .format(formats, na_rep="", escape="html")
        .format_index(escape="html", axis=0)
        .format_index(escape="html", axis=1)
    )


def mutation_curves(report: Report) -> Figure:
    """For each detected mutation, the share of its tolerance each stage uses (max_abs in older reports) against
    the real runtime pairs' (grey), log scale; the line at 1 is the tolerance, ★ the mutation's first divergence.
    As in :func:`~driftscope.views.curves.error_curves`: a stage not compared is a gap, "=" is exactly equal, a
    failure with no finite value (an exact stage, shapes that differ) a marker along the top."""
    from .axes import draw, legend_markers, log_range, series, stage_ticks, star
    from .curves import pair_series, plotted_stages, stage_blocks
    from .notebook import describe

    power = report.data.get("power") or {}
    detected = [m for m in power.get("mutations", []) if m["detected"]]
    stages = plotted_stages(report)
    extra = [m["first_divergence"] for m in detected if m["first_divergence"] and m["first_divergence"] not in stages]
    if extra:  # a mutation's first divergence at a stage no real pair diverges at (an exact stage): on the axis too
        wanted = set(stages) | set(extra)
        stages = [s["id"] for s in report.data.get("stage_plan", []) if s["id"] in wanted]
    xs = np.arange(len(stages), dtype=float)
    shared = all("tolerance_used" in r for m in detected for r in m["rows"])
    metric, label = ("tolerance_used", "share of tolerance used") if shared else ("max_abs", "max |a - e|")
    figure = Figure(figsize=(14, 3.8 * max(len(detected), 1) + 1.2), layout="constrained")
    axes = figure.subplots(max(len(detected), 1), 1, sharex=True, squeeze=False)[:, 0]
    every = report.rows
    real = [pair_series(report, key, stages, metric, every) for key in report.pair_keys()]
    for axis, mutation in zip(axes, detected, strict=False):
        for index, pair in enumerate(real):
            draw(axis, xs, pair, "#aaaaaa", "", 0, "real runtime pairs" if index == 0 else None)
        rows = mutation["rows"]
        own = series(stages, rows, lambda r: r.get(metric), lambda r: r.get("status", "pass"), lambda r: r["stage"])
        draw(axis, xs, own, "#d62728", ".", 6, mutation["mutation"])
        first = mutation["first_divergence"]
        if first in stages:
            at = stages.index(first)
            axis.axvline(xs[at], color="#d62728", linestyle="--", linewidth=1)
            star(axis, xs[at], own, at, "#d62728")
        axis.set_yscale("log")
        axis.set_ylim(*log_range([own.values, *(p.values for p in real)], 1.0 if shared else None))
        if shared:
            axis.axhline(1.0, color="black", linewidth=1)
        legend_markers(axis, [own, *real])
        axis.set_ylabel(label)
        axis.set_xlabel("stage (execution order; a gap: not compared there)", fontsize=8)
        axis.set_title(f"{mutation['mutation']}: first divergence {first}", fontsize=9)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    stage_ticks(axes, stages, stage_blocks(report))
    size = axes[-1].get_xticklabels()[0].get_fontsize() if stages else 7
    for axis in axes:  # every panel names its stages (a panel read alone must say where its star is), as the last
        axis.tick_params(axis="x", labelbottom=True, labelrotation=90, labelsize=size)
    axes[-1].set_xlim(-0.7, len(stages) - 0.3)
    tolerance = "; black line: the tolerance" if shared else ""
    figure.suptitle(
        f"each detected mutation (red) against the real runtime pairs (grey); ★: first divergence{tolerance}",
        fontsize=10,
    )
    names = ", ".join(f"{m['mutation']} at {m['first_divergence']}" for m in detected) or "none"
    return describe(figure, f"Error per stage of each detected mutation against the real runtime pairs: {names}.")
