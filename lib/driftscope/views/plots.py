"""Figures the notebooks show. Each returns a matplotlib Figure built without pyplot's global state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..report import Report

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


def error_curves(report: Report, metrics: tuple[str, ...] = ("max_abs", "rms", "failures")) -> Figure:
    """Per-stage error against execution order, log scale, one line per runtime pair, tolerance marked."""
    ordered, position = _stage_axis(report, activations_only=True)
    rows = [row for row in report.rows if row.stage in position and row.status in ("pass", "fail")]
    figure = Figure(figsize=(12, 2.8 * len(metrics)), layout="constrained")
    axes = figure.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    atol = report.data.get("contract", {}).get("default", {}).get("atol")
    first = report.data.get("first_divergence", {})
    for color, label in zip(COLORS, report.pair_keys(), strict=False):
        pair = sorted(
            (row for row in rows if (row.pair or row.candidate) == label), key=lambda row: position.get(row.stage, 0)
        )
        xs = [position.get(row.stage, 0) for row in pair]
        for axis, metric in zip(axes, metrics, strict=False):
            values = np.array([getattr(row, metric) for row in pair], dtype=float)
            if metric == "failures":
                values = values + 1.0  # log axis: 1 means no failure
            axis.plot(
                xs,
                np.maximum(values, 1e-9),
                marker=".",
                markersize=3,
                linewidth=1,
                color=color,
                label=report.pair_title(label),
            )
            divergence = first.get(label)
            if divergence and divergence["stage"] in position:
                axis.axvline(position[divergence["stage"]], color=color, linestyle="--", linewidth=1)
    for axis, metric in zip(axes, metrics, strict=False):
        axis.set_yscale("log")
        axis.set_ylabel("failures + 1" if metric == "failures" else f"{metric} (floor 1e-9)")
        axis.grid(True, which="major", alpha=0.3)
        if metric == "max_abs" and atol:
            axis.axhline(atol, color="black", linestyle=":", linewidth=1, label=f"atol {atol}")
    ticks, labels = _block_ticks(report, ordered)
    axes[-1].set_xticks(ticks, labels, rotation=90, fontsize=7)
    axes[-1].set_xlabel("stage (execution order; dashed: first divergence)")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0.0)
    axes[0].set_title(f"{report.data.get('name')}: error per stage, one line per runtime pair")
    return figure


def input_images(report: Report) -> Figure:
    """The input images as the processor resized them, with the family's overlay (e.g. its attention-window
    grid) drawn over and its caption."""
    from PIL import Image
    from transformers.image_transforms import convert_to_rgb

    from ..families import get_family

    inputs = report.data.get("inputs", {})
    paths = inputs.get("images", [])
    overlay = get_family(report.data["family"]).view_hooks().input_overlay
    figure = Figure(figsize=(3.2 * max(len(paths), 1), 3.4), layout="constrained")
    axes = figure.subplots(1, max(len(paths), 1), squeeze=False)[0]
    for index, (axis, path, size) in enumerate(zip(axes, paths, inputs.get("resized", []), strict=False)):
        height, width = size
        with Image.open(path) as image:  # RGB as the processor made it (transparency onto white)
            rgb = Image.fromarray(convert_to_rgb(image, return_numpy=True))
            axis.imshow(np.asarray(rgb.resize((width, height))))
        step, caption = overlay(inputs, index)
        for x in range(step, width, step) if step else ():
            axis.axvline(x, color="white", linewidth=0.8)
        for y in range(step, height, step) if step else ():
            axis.axhline(y, color="white", linewidth=0.8)
        axis.set_title(f"{Path(path).name}\n{caption}", fontsize=8)
        axis.set_axis_off()
    return figure


def stage_table(report: Report, only_failing: bool = False):
    """Stage x runtime-pair table of status, max_abs and failures (a pandas Styler, failures in red)."""
    import pandas as pd

    frame = report.frame()
    if frame.empty:
        return frame
    ordered, position = _stage_axis(report)
    frame["order"] = frame["stage"].map(position)
    wide = frame.pivot_table(index=["order", "stage"], columns="pair", values=["max_abs", "failures"], aggfunc="first")
    status = frame.pivot_table(index=["order", "stage"], columns="pair", values="status", aggfunc="first")
    wide.columns = [f"{candidate} {metric}" for metric, candidate in wide.columns]
    status.columns = [f"{candidate} status" for candidate in status.columns]
    table = pd.concat([status, wide], axis=1).sort_index(axis=1).droplevel("order")
    if only_failing:
        table = table[(status != "pass").any(axis=1).to_numpy()]

    def highlight(value):
        return "background-color: #f8d0d0" if value in ("fail", "shape_mismatch", "layout_mismatch") else ""

    formats = {column: "{:.3g}" for column in table.columns if column.endswith("max_abs")}
    # a Styler writes labels raw into its HTML: every value, stage id and runtime label is escaped
    return (
        table.style.map(highlight)
        .format(na_rep="", escape="html")
        .format(formats, na_rep="", escape="html")
        .format_index(escape="html", axis=0)
        .format_index(escape="html", axis=1)
    )


def mutation_curves(report: Report) -> Figure:
    """For each detected mutation, its max_abs per stage against the real candidates' (grey), log scale."""
    power = report.data.get("power") or {}
    detected = [m for m in power.get("mutations", []) if m["detected"]]
    ordered, position = _stage_axis(report, activations_only=True)
    figure = Figure(figsize=(12, 2.4 * max(len(detected), 1)), layout="constrained")
    axes = figure.subplots(max(len(detected), 1), 1, sharex=True, squeeze=False)[:, 0]
    atol = report.data.get("contract", {}).get("default", {}).get("atol")
    real = [row for row in report.rows if row.stage in position and row.status in ("pass", "fail")]
    ticks, labels = _block_ticks(report, ordered)
    for axis, mutation in zip(axes, detected, strict=False):
        for key in report.pair_keys():
            pair = sorted((r for r in real if (r.pair or r.candidate) == key), key=lambda r: position[r.stage])
            axis.plot(
                [position[r.stage] for r in pair],
                np.maximum([r.max_abs for r in pair], 1e-9),
                color="#aaaaaa",
                linewidth=0.8,
            )
        rows = sorted((r for r in mutation["rows"] if r["stage"] in position), key=lambda r: position[r["stage"]])
        axis.plot(
            [position[r["stage"]] for r in rows],
            np.maximum([r["max_abs"] for r in rows], 1e-9),
            color="#d62728",
            linewidth=1.4,
            label=mutation["mutation"],
        )
        if mutation["first_divergence"] in position:
            axis.axvline(position[mutation["first_divergence"]], color="#d62728", linestyle="--", linewidth=1)
        if atol:
            axis.axhline(atol, color="black", linestyle=":", linewidth=1)
        axis.set_yscale("log")
        axis.set_ylabel("max_abs")
        axis.legend(loc="upper left", fontsize=8)
        axis.grid(True, alpha=0.3)
    axes[-1].set_xticks(ticks, labels, rotation=90, fontsize=7)
    axes[0].set_title("detected mutations (red) against the real runtime pairs (grey); dotted: atol")
    return figure
