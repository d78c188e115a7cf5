"""Honest axes for the per-stage figures: what a stage's value is, and how it is drawn.

A stage a pair never compared (not captured on one side, skipped) is a gap in its curve, never a value; a stage
whose comparison found no difference at all (``max |a - e| = 0``) is drawn as a distinct "exactly equal" marker
along the bottom of the panel (a log axis has no zero); a stage that fails without a finite value (non-finite
elements, shapes or layouts that differ, an exact stage that differs) is a marker along the top. The y range is
set around the data and the tolerance line with headroom, so no failing point sits on the border; counts get
integer ticks; a long stage axis is grouped by block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

COMPARED = ("pass", "fail")
UNCOMPARABLE = ("shape_mismatch", "layout_mismatch")  # a failing comparison with no per-element value
EXACT_MARKER, EXACT_AT = "$=$", 0.05  # "exactly equal": at 5% of the panel's height, in the pair's colour
OVER_MARKER, OVER_AT = "^", 0.95  # fails with no finite value: at 95% of the panel's height
HEADROOM = 6.0  # the top of a log panel: its largest value (or the tolerance line) times this
GROUPED_AT = 40  # more stages than this: the tick labels are the substages, grouped under their block


def stage_label(stage_id: str, tower: str = "vision") -> str:
    """A short x-axis label: ``vision.block.3.attn.q`` -> ``b3.attn.q``, ``vision.patch_embed`` -> ``patch_embed``."""
    parts = stage_id.split(".")
    if parts[0] == tower:
        parts = parts[1:]
    if len(parts) >= 2 and parts[0] == "block" and parts[1].isdigit():
        parts = [f"b{parts[1]}", *parts[2:]]
    return ".".join(parts) or stage_id


@dataclass
class Series:
    """One pair's values over the stage axis: ``values`` (NaN where nothing is drawn on the curve), ``exact``
    (compared and exactly equal), ``over`` (failed with no finite value), ``compared`` (the pair compared it)."""

    values: np.ndarray
    exact: np.ndarray
    over: np.ndarray
    compared: np.ndarray


def series(
    stages: list[str],
    rows: Iterable,
    value: Callable[[object], float | None],
    status: Callable[[object], str],
    stage: Callable[[object], str],
    exact_zero: bool = True,
) -> Series:
    """``rows`` (one per stage at most) laid over ``stages``. ``exact_zero``: a value of 0 is "exactly equal"
    (a metric of the difference); False for a count, where 0 is drawn as 0."""
    position = {name: index for index, name in enumerate(stages)}
    values = np.full(len(stages), np.nan)
    exact, over, compared = (np.zeros(len(stages), bool) for _ in range(3))
    for row in rows:
        at = position.get(stage(row))
        if at is None:
            continue
        said = status(row)
        if said in UNCOMPARABLE:
            over[at] = compared[at] = True
            continue
        if said not in COMPARED:
            continue  # not captured, skipped: a gap
        compared[at] = True
        number = value(row)
        number = math.nan if number is None else float(number)
        if math.isnan(number) or math.isinf(number):
            over[at] = said == "fail" or math.isinf(number)
        elif number == 0 and exact_zero:
            exact[at] = True
        else:
            values[at] = number
    return Series(values, exact, over, compared)


def log_range(shown: list[np.ndarray], line: float | None = None) -> tuple[float, float]:
    """A log panel's (bottom, top): every positive finite value and the tolerance ``line`` inside, with
    ``HEADROOM`` above the largest and room below the smallest for the "exactly equal" markers."""
    values = np.concatenate([np.asarray(v, float).ravel() for v in shown] or [np.zeros(0)])
    values = values[np.isfinite(values) & (values > 0)]
    high = float(values.max()) if values.size else (line or 1.0)
    if line:
        high = max(high, line)
    low = float(values.min()) if values.size else (line or high) / 100
    if line:
        low = min(low, line / 10)
    top = high * HEADROOM
    bottom = max(low / 8, top * 1e-14)
    return bottom, top


def draw(axis, xs: np.ndarray, drawn: Series, color: str, marker: str, size: float, label: str | None) -> None:
    """One pair's curve (gaps where nothing is drawn), its "exactly equal" and "no finite value" markers."""
    axis.plot(
        xs,
        drawn.values,
        color=color,
        linewidth=1.0,
        alpha=0.85,
        marker=marker,
        markersize=size,
        markerfacecolor="none",
        markeredgewidth=1.1,
        label=label,
    )
    markers(axis, xs, drawn, color)


def from_numbers(numbers: Iterable[float | None]) -> Series:
    """A metric read straight from numbers (one per x, every one compared): None or non-finite has no finite
    value (a marker along the top), 0 is exactly equal (a marker along the bottom), the rest are the curve."""
    raw = np.array([math.nan if n is None else float(n) for n in numbers], dtype=float)
    exact = raw == 0
    over = ~np.isfinite(raw)
    values = np.where(exact | over, np.nan, raw)
    return Series(values, exact, over, np.ones(raw.size, bool))


def markers(axis, xs: np.ndarray, drawn: Series, color: str) -> None:
    """A series' "exactly equal" markers (bottom of the panel) and "no finite value" markers (top)."""
    xs = np.asarray(xs)
    along = axis.get_xaxis_transform()  # x in data, y in the panel's height
    if drawn.exact.any():
        axis.plot(xs[drawn.exact], np.full(drawn.exact.sum(), EXACT_AT), linestyle="none", marker=EXACT_MARKER,
                  markersize=9, color=color, transform=along)  # fmt: skip
    if drawn.over.any():
        axis.plot(xs[drawn.over], np.full(drawn.over.sum(), OVER_AT), linestyle="none", marker=OVER_MARKER,
                  markersize=8, color=color, transform=along)  # fmt: skip


def star(axis, x: float, drawn: Series, at: int, color: str) -> None:
    """The ★ of a first divergence at stage index ``at``: on its value, or on its marker when it has none."""
    if np.isfinite(drawn.values[at]):
        axis.plot(x, drawn.values[at], marker="*", markersize=16, color=color, zorder=5)
    else:
        y = EXACT_AT if drawn.exact[at] else OVER_AT
        axis.plot(x, y, marker="*", markersize=16, color=color, zorder=5, transform=axis.get_xaxis_transform())


def legend_markers(axis, shown: list[Series]) -> None:
    """Legend entries for the markers that are on the panel (none when nothing is exact or uncomparable)."""
    if any(s.exact.any() for s in shown):
        axis.plot([], [], linestyle="none", marker=EXACT_MARKER, markersize=9, color="#555555",
                  label="exactly equal (max |a - e| = 0)")  # fmt: skip
    if any(s.over.any() for s in shown):
        axis.plot([], [], linestyle="none", marker=OVER_MARKER, markersize=8, color="#555555",
                  label="fails with no finite value (non-finite, shape or exact stage)")  # fmt: skip


def count_axis(axis, largest: float) -> None:
    """Integer ticks for a count: linear up to 20, else a symmetric log axis ticked 0, 1, 10, 100, ..."""
    largest = max(float(largest) if np.isfinite(largest) else 0.0, 1.0)
    if largest <= 20:
        axis.set_ylim(-0.5, largest * 1.25 + 0.5)
        axis.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=2))
    else:
        axis.set_yscale("symlog", linthresh=1.0, linscale=0.4)
        axis.set_ylim(-0.3, largest * HEADROOM)
        decades = [0.0] + [10.0**k for k in range(int(math.log10(largest * HEADROOM)) + 1)]
        axis.yaxis.set_major_locator(FixedLocator(decades))
        axis.yaxis.set_minor_locator(NullLocator())
    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{int(round(value)):,}"))


def integer_ticks(axis) -> None:
    """Integer ticks on both axes (patch rows and columns, token and channel indices)."""
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))


NAMED_FROM = 3  # a block with this many stages on the axis is named above them; a shorter one in its tick labels


def stage_groups(stages: list[str], blocks: dict[str, int]) -> tuple[list[str], list[list]]:
    """Tick labels for a long stage axis and the runs of one block's stages, ``[block, first, last, named]``: a
    block with :data:`NAMED_FROM` stages or more is named above them and its ticks say the substage (``attn.q``; its
    output ``out``); a shorter one (a block whose output alone was captured) says its block in each tick (``b5``,
    ``b5.attn.q``), so block names never crowd each other above the panel."""
    spans: list[list] = []
    for index, stage_id in enumerate(stages):
        block = blocks.get(stage_id)
        if block is None:
            continue
        if spans and spans[-1][0] == block and spans[-1][2] == index - 1:
            spans[-1][2] = index
        else:
            spans.append([block, index, index, False])
    for span in spans:
        span[3] = span[2] - span[1] + 1 >= NAMED_FROM
    named = {index for block, start, stop, name in spans if name for index in range(start, stop + 1)}
    labels = []
    for index, stage_id in enumerate(stages):
        short = stage_label(stage_id)
        block = blocks.get(stage_id)
        if index not in named or block is None:
            labels.append(short)
            continue
        prefix = f"b{block}."
        labels.append(short[len(prefix) :] if short.startswith(prefix) else "out")
    return labels, spans


def stage_ticks(axes, stages: list[str], blocks: dict[str, int]) -> None:
    """Label every stage on the bottom panel. Past ``GROUPED_AT`` stages, a block's stages are shaded alternately
    and labelled as :func:`stage_groups` says (a block of several stages named above the top panel)."""
    if len(stages) <= GROUPED_AT or not blocks:
        axes[-1].set_xticks(range(len(stages)), [stage_label(s) for s in stages], rotation=90, fontsize=7)
        return
    labels, spans = stage_groups(stages, blocks)
    axes[-1].set_xticks(range(len(stages)), labels, rotation=90, fontsize=6.5)
    for number, (block, start, stop, named) in enumerate(spans):
        for axis in axes:
            if number % 2 == 0:
                axis.axvspan(start - 0.5, stop + 0.5, color="#000000", alpha=0.05, linewidth=0, zorder=0)
        if named:
            axes[0].text((start + stop) / 2, 1.01, f"block {block}", transform=axes[0].get_xaxis_transform(),
                         ha="center", va="bottom", fontsize=6.5, color="#333333")  # fmt: skip
    if axes[0].get_title():  # above the block names
        axes[0].set_title(axes[0].get_title(), fontsize=9, pad=13)
