"""Figures and tables of notebook 02 (layer drill-down)."""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from driftscope.core.markup import code, text
from driftscope.run.report import Report

from .errormaps import StageDifference, magnitude_split, patch_error_grid
from .notebook import describe, plural, table
from .plots import block_outputs, landmarks

FEW = 3  # failures this few are named one by one, not as the top channels' share
LABEL_COLORS = {"introduced": "#d62728", "amplified": "#ff7f0e", "inherited": "#1f77b4", "clean": "#bbbbbb"}


def default_focus(report: Report) -> tuple[str | None, str | None]:
    """(pair, stage) to drill into: the first pair with a divergence and its first divergent stage."""
    first = report.data.get("first_divergence", {})
    for pair in report.pair_keys():
        if first.get(pair):
            return pair, first[pair]["stage"]
    pairs = report.pair_keys()
    return (pairs[0] if pairs else None), None


def choose(report: Report, pair: str | None, layers: list[int] | None, stage: str | None):
    """``(pair, layers, stage)``: what was asked, else the first divergent pair, its first divergent stage and
    that stage's block (else the first block output). A stage in no block (a text layer, the projector, the patch
    embedding) chooses no block: a tower block's substages would say nothing about it."""
    focus_pair, focus_stage = default_focus(report)
    pair = pair or focus_pair
    first_block = next((s["id"] for s in report.data.get("stage_plan", []) if s["id"] in block_outputs(report)), None)
    if stage is None and pair == focus_pair and focus_stage in report.plan and report.plan[focus_stage].integer:
        # an exact first divergence (a mask, an index) has no channels: the maps show the first float stage that fails
        failing = [r.stage for r in report.rows if (r.pair or r.candidate) == pair and r.failed and not r.integer]
        focus_stage = failing[0] if failing else None
    stage = stage or focus_stage or first_block
    if layers is None:
        layers = [block_of(stage)] if block_of(stage) is not None else []
    return pair, list(layers), stage


def focus_markdown(report: Report, pair: str, layers: list[int], stage: str | None) -> str:
    """What this page drills into, and where the replay found the first introduced error, in words."""
    from .finding import where_markdown

    replay = (report.data.get("replay") or {}).get(pair)
    sites = report.conclusion(pair).get("sites") or []
    if replay is None:
        introduced = "no replay of this pair (its candidate cannot replay single stages, or `replay` left it out)"
    elif len(sites) > 1:
        introduced = f"{len(sites)} sites introduce error, by operator: {where_markdown(report, pair)}"
    elif replay.get("first_introduced"):
        introduced = f"the first stage that introduces error is {code(replay['first_introduced'])}"
    else:
        introduced = "no replayed stage introduces error beyond the contract (every one is clean, or inherits it)"
    blocks = text(", ".join(str(block) for block in layers)) if layers else f"none ({_no_block(stage)})"
    return (
        f"**Runtime pair** {code(report.pair_title(pair))}; **block(s)** {blocks}; **stage for the maps** "
        f"{code(stage or 'none')}. Replay: {introduced}."
    )


def substages(report: Report, pair: str, layers: list[int]):
    """The chosen blocks' substages as the run compared them (with the replay's label where it replayed them),
    or a plain sentence saying the run did not capture them (or that no block is chosen)."""
    import pandas as pd

    from driftscope.judge.rows import share_of_tolerance

    if not layers:
        return (
            "No block is chosen, so there are no substages to show: the stage for the maps is in no block, and the "
            "run compares it at its output. Set `layers` to a block to see its substages."
        )
    rows = [
        r
        for r in report.rows
        if (r.pair or r.candidate) == pair and block_of(r.stage) in layers and r.stage not in block_outputs(report)
    ]
    if not rows:
        asked = (report.data.get("parameters") or {}).get("stages", {}).get("substages")
        return (
            f"The run captured no substages of block(s) {text(', '.join(map(str, layers)))}: only the block "
            f"output is compared (the parameter file's `stages: substages` is {code(asked)}). Add the block to "
            "`stages: substages` and run again, or re-capture this block with or without a patch at the end of "
            "this page."
        )
    labels = {x["stage"]: x for x in (report.data.get("replay") or {}).get(pair, {}).get("labels", [])}
    return pd.DataFrame(
        [
            {
                "stage": r.stage,
                "status": r.status,
                "failures": r.failures,
                "tolerance used": share_of_tolerance(r) if r.status in ("pass", "fail") else None,
                "max |a - e|": r.max_abs,
                "relative RMS": r.relative_rms,
                "replay label": labels.get(r.stage, {}).get("label", "not replayed"),
                "op-local relative RMS": labels.get(r.stage, {}).get("op_local_relative_rms"),
                "amplification": labels.get(r.stage, {}).get("amplification"),
            }
            for r in rows
        ]
    )


def captured_substages(report: Report, pair: str, block: int):
    """``(sentence, frame)``: the block's substages captured now on both sides of the pair (only this block; the
    reference's capture is kept under ``<run>/recapture/`` and reused), for a run that compared only the block
    output. The run's report is not changed."""
    import pandas as pd

    from driftscope.judge.rows import share_of_tolerance
    from driftscope.run.patch_trial import recapture_block

    trial = recapture_block(report, pair, block, log=lambda message: None)
    sentence = (
        f"The run compared only the output of block {text(block)}: its substages were captured now for "
        f"{code(report.pair_title(pair))} (this block only, in {trial.seconds:.1f} s), under the run's contract."
    )
    frame = pd.DataFrame(
        [
            {
                "stage": r.stage,
                "status": r.status,
                "failures": r.failures,
                "tolerance used": share_of_tolerance(r) if r.status in ("pass", "fail") else None,
                "max |a - e|": r.max_abs,
                "relative RMS": r.relative_rms,
                "note": r.note,
            }
            for r in trial.rows
        ]
    )
    return sentence, frame


def replay_frame(report: Report, pair: str, layers: list[int]):
    """The op-local replay rows of the chosen blocks (the candidate's operator fed the reference's input)."""
    import pandas as pd

    replayed = (report.data.get("replay") or {}).get(pair, {}).get("rows", [])
    rows = [row for row in replayed if block_of(row["stage"]) in layers]
    columns = {"stage": "stage", "status": "status", "failures": "failures", "max_abs": "max |a - e|"}
    columns.update({"relative_rms": "relative RMS", "cosine": "cosine"})
    return pd.DataFrame(
        [{shown: row.get(key) for key, shown in columns.items()} for row in rows], columns=[*columns.values()]
    )


def where_markdown(difference: StageDifference, share: float, collapsed: int) -> str:
    """Where a stage's failures sit, in one sentence: the top channels' share, collapsed rows, by magnitude."""
    split = magnitude_split(difference)
    total = split["failures_small"] + split["failures_large"]
    if not total:
        return f"{code(difference.stage)}: no element fails; **{collapsed}** rows collapsed to zero."
    if total <= FEW:  # a share of a handful says nothing: where each one is
        at = np.argwhere(difference.failing)[:FEW]
        where = ", ".join(f"token {int(row)}, channel {int(column)}" for row, column in at)
        return (
            f"{code(difference.stage)}: {plural(total, 'failure')}, at {where}; **{collapsed}** rows collapsed to zero."
        )
    return (
        f"{code(difference.stage)}: the top 3 channels carry **{share:.0%}** of the {plural(total, 'failure')}; "
        f"**{collapsed}** rows collapsed to zero; by magnitude, {plural(split['failures_small'], 'failure')} at "
        f"|expected| ≤ {split['split_at']:.3g} (the median) and {split['failures_large']} above it."
    )


def recapture_hint(pair: str, layers: list[int], report: Report | None = None) -> str:
    """How to try a fix on the chosen block without running everything again; with ``report``, the family's
    ready patch for the operator that introduces the pair's error, where one exists."""
    conclusion = report.conclusion(pair) if report else {}
    if layers:
        hint = (
            f'Set `patch` in the parameters cell (e.g. `patch = "driftscope.hypotheses:NAME"`, '
            f'`"my_fix.py:function"`, or a dictionary of its `callable` and `kwargs`) and run this cell again: it '
            f"captures block {text(layers[0])} of {code(pair)} with the patch applied (only that "
            "runtime loads; the reference's capture is the run's) and compares it stage by stage with the run."
        )
    else:
        block = block_of(conclusion.get("stage"))  # the operator the conclusion blames
        named = "" if block is None else f" (`layers = [{block}]`: the block of the operator that introduces it)"
        hint = (
            f"No block is chosen (the stage for the maps is in no block): set `layers` to a block{named} and "
            "`patch` in the parameters cell to capture that block again with a fix."
        )
    patches = conclusion.get("ready_patches") or []
    if not patches:
        return hint
    if conclusion.get("kind") == "data":  # index math, no block's operator: the patch re-runs the pair
        return f"**Ready patch**: {code(conclusion.get('first_divergence'))} (data: inputs or index math) first " + (
            f"differs; the family's ready patch for it is {code(patches[0])}: run the pair again with it (its "
            f"`patch:` in the parameter file; a block captured again here would not reach it).\n\n{hint}"
        )
    return (
        f"**Ready patch**: {code(conclusion['stage'])} introduces this pair's error, and the family's ready patch "
        f'for it is {code(patches[0])}: set `patch = "{patches[0]}"` and run this cell again.\n\n{hint}'
    )


def recapture(report: Report, pair: str, layers: list[int], patch) -> list:
    """What the recapture cell shows: with no ``patch``, how to try one (:func:`recapture_hint`); else block
    ``layers[0]`` of ``pair`` captured again with it (``run.patch_trial``), in words and stage by stage."""
    from IPython.display import Markdown

    from driftscope.errors import ParameterError
    from driftscope.run.patch_trial import recapture_block

    if patch is None:
        return [Markdown(recapture_hint(pair, layers, report))]
    if not layers:
        block = block_of(report.conclusion(pair).get("stage"))
        raise ParameterError(
            "a patch is tried on a block, and no block is chosen",
            f"set `layers = [{block if block is not None else 0}]` (a block of the tower) and run the cell again",
        )
    trial = recapture_block(report, pair, layers[0], patch)
    return [Markdown(trial.markdown()), table(trial.frame(), highlight="patched: status")]


def _no_block(stage: str | None) -> str:
    """Why no block is chosen, in a few words."""
    return f"{code(stage)} is in no block" if stage else "no stage to drill into"


def block_of(stage: str | None) -> int | None:
    """The block number of a stage id (``<tower>.block.<n>[.<substage>]``), or None."""
    parts = (stage or "").split(".")
    if len(parts) >= 3 and parts[1] == "block" and parts[2].isdigit():
        return int(parts[2])
    return None


def label_frame(report: Report, pair: str, blocks: list[int] | None = None):
    """Introduced / amplified / inherited / clean per replayed stage (optionally only some blocks)."""
    import pandas as pd

    labels = (report.data.get("replay") or {}).get(pair, {}).get("labels", [])
    frame = pd.DataFrame(labels)
    if frame.empty or blocks is None:
        return frame
    keep = frame["stage"].map(lambda s: block_of(s) in blocks)
    return frame[keep].reset_index(drop=True)


def introduced_curve(report: Report, pair: str) -> Figure:
    """Accumulated and op-local relative RMS over every block output, labels as marker colours."""
    blocks, marks = block_outputs(report), landmarks(report)
    labels = [
        x
        for x in (report.data.get("replay") or {}).get(pair, {}).get("labels", [])
        if x["stage"] in blocks or any(x["stage"] == m or x["stage"].startswith(m + ".") for m in marks)
    ]
    figure = Figure(figsize=(11, 3.6), layout="constrained")
    axis = figure.subplots()
    if not labels:
        axis.text(0.5, 0.5, f"no replay for {pair}", ha="center", transform=axis.transAxes)
        return figure
    from .axes import from_numbers, legend_markers, log_range, markers

    xs = np.arange(len(labels))
    acc = from_numbers(x["accumulated_relative_rms"] for x in labels)  # 0: exactly equal, a marker, not 1e-9
    op = from_numbers(x["op_local_relative_rms"] for x in labels)
    axis.plot(xs, acc.values, color="#444444", label="accumulated (normal run)", linewidth=1.2)
    axis.plot(xs, op.values, color="#9467bd", linestyle="--", label="op-local (fed the reference's input)",
              linewidth=1.2)  # fmt: skip
    axis.scatter(xs, op.values, c=[LABEL_COLORS[x["label"]] for x in labels], s=30, zorder=3)
    markers(axis, xs, acc, "#444444")
    markers(axis, xs, op, "#9467bd")
    for name, color in LABEL_COLORS.items():
        axis.scatter([], [], c=color, label=name)
    legend_markers(axis, [acc, op])
    axis.set_yscale("log")
    axis.set_ylim(*log_range([acc.values, op.values]))
    axis.set_xticks(xs, [x["stage"].split(".", 1)[-1] for x in labels], rotation=90, fontsize=7)
    axis.set_ylabel("relative RMS error")
    axis.set_title(f"{pair}: accumulated vs op-local error per block (marker: label)")
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    axis.grid(True, alpha=0.3)
    return figure


def channel_map(difference: StageDifference) -> Figure:
    """|difference| as tokens x channels, one panel per image, log colour scale; exactly equal elements are
    white (not the scale's lowest colour), the axes ticked at whole tokens and channels."""
    from .axes import integer_ticks

    panels = difference.image_rows
    figure = Figure(figsize=(5.5 * len(panels), 4.2), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    diff = np.nan_to_num(difference.diff, nan=np.inf)
    positive = diff[np.isfinite(diff) & (diff > 0)]
    low = float(np.quantile(positive, 0.01)) if positive.size else 1e-9
    high = float(positive.max()) if positive.size else 1.0
    colours = matplotlib.colormaps["magma"].with_extremes(bad="#ffffff")
    exact = int((diff == 0).sum())
    for number, (axis, (start, stop)) in enumerate(zip(axes, panels, strict=True)):
        part = diff[start:stop]
        shown = axis.imshow(
            np.where(part == 0, np.nan, np.maximum(part, low)),  # 0: exactly equal, drawn white
            aspect="auto",
            interpolation="nearest",
            cmap=colours,
            norm=LogNorm(vmin=low, vmax=max(high, low * 10)),
        )
        integer_ticks(axis)
        axis.set_xlabel("channel")
        axis.set_ylabel(f"token ({difference.token_order} order)")
        axis.set_title(f"{difference.stage}: image {number}", fontsize=9)
    equal = f"; white: exactly equal ({exact} elements)" if exact else ""
    figure.colorbar(shown, ax=axes.tolist(), label=f"|actual - expected|{equal}")
    return figure


def magnitude_scatter(difference: StageDifference, points: int = 20000) -> Figure:
    """|difference| against |expected| with the contract's bound; where failures sit by magnitude."""
    figure = Figure(figsize=(6, 4.2), layout="constrained")
    axis = figure.subplots()
    expected = np.abs(difference.expected).ravel()
    diff = difference.diff.ravel()
    failing = difference.failing.ravel()
    pick = np.random.default_rng(0).permutation(expected.size)[:points]
    pick = np.union1d(pick, np.flatnonzero(failing))  # every failing element, however many are sampled
    equal = int((diff == 0).sum())
    pick = pick[diff[pick] != 0]  # exactly equal elements have no place on a log axis: counted in the title
    x = np.maximum(expected[pick], 1e-6)
    y = np.nan_to_num(diff[pick], nan=1e6)
    bad = failing[pick]
    axis.scatter(x[~bad], y[~bad], s=2, c="#1f77b4", alpha=0.4, label="passing", rasterized=True)
    axis.scatter(x[bad], y[bad], s=18, c="#d62728", edgecolors="black", linewidths=0.4, zorder=3, label="failing")
    grid = np.logspace(-6, np.log10(max(expected.max(), 1e-5)), 50)
    axis.plot(grid, difference.atol + difference.rtol * grid, color="black", linestyle=":", label="atol + rtol|e|")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("|expected|")
    axis.set_ylabel("|actual - expected|")
    exact = f"; {equal} exactly equal, not drawn" if equal else ""
    axis.set_title(f"{difference.stage}: {int(failing.sum())} failing elements (red, drawn on top){exact}", fontsize=9)
    axis.legend(fontsize=8)
    return describe(
        figure,
        f"|actual - expected| against |expected| at {difference.stage}, with the bound atol + rtol|e|; "
        f"{int(failing.sum())} failing elements in red.",
    )


def spatial_map(report: Report, stage: str, pair: str, image: int = 0, replay: bool = False) -> Figure:
    """Per-patch RMS error over the resized input image, in raster order."""
    from PIL import Image

    from .axes import integer_ticks

    grid = patch_error_grid(report, stage, pair, image, replay)
    if grid is None:
        figure = Figure(figsize=(10, 0.8), layout="constrained")
        axis = figure.subplots()
        axis.set_axis_off()
        said = f"No per-patch map: {stage}'s rows are the prompt's tokens, not the image's patches."
        axis.text(0, 0.5, said, fontsize=10, va="center")
        return describe(figure, said)
    inputs = report.data.get("inputs", {})
    paths, resized = inputs.get("images") or [], inputs.get("resized") or []
    path = paths[image] if image < len(paths) else None  # a video's grid has no one image to draw under it
    height, width = resized[image] if image < len(resized) else (grid.shape[0] * 14, grid.shape[1] * 14)
    figure = Figure(figsize=(10, 4.6), layout="constrained")
    left, right = figure.subplots(1, 2)
    if path:
        with Image.open(path) as picture:
            left.imshow(np.asarray(picture.convert("RGB").resize((width, height))))
    from matplotlib.colors import Normalize

    norm = Normalize(
        vmin=float(np.nanmin(grid)), vmax=float(np.nanmax(grid))
    )  # NaN: a cell with no patch  # one scale for both panels and the bar
    left.imshow(grid, extent=(0, width, height, 0), cmap="inferno", norm=norm, alpha=0.6, interpolation="nearest")
    left.set_title(f"{stage}: per-patch RMS error over the image", fontsize=9)
    left.set_axis_off()
    shown = right.imshow(grid, cmap="inferno", norm=norm, interpolation="nearest")
    integer_ticks(right)  # whole patches
    right.set_title("the same grid alone (raster order; the colour bar's scale)", fontsize=9)
    right.set_xlabel("patch column")
    right.set_ylabel("patch row")
    figure.colorbar(shown, ax=[left, right], label="RMS error per patch")
    return describe(figure, f"Per-patch RMS error of {stage} ({pair}) over the resized image and alone, raster order.")
