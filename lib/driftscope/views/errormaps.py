"""Where in a stage the error lives: channels, tokens, magnitudes, and image patches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.judge.layout import align, take_rows
from driftscope.run.report import Report
from driftscope.taps.stages import TokenOrder, orders_of
from driftscope.taps.tapset import TapSet

from ..families import get_family
from ..families.base import ImageTokens


@dataclass
class StageDifference:
    """One stage of a runtime pair as [tokens, channels] matrices (heads flattened), in the stored token order."""

    stage: str
    expected: np.ndarray
    actual: np.ndarray
    atol: float
    rtol: float
    token_order: str
    image_rows: list[tuple[int, int]]  # token row ranges of each image (patch rows)

    @property
    def diff(self) -> np.ndarray:
        return np.abs(self.actual.astype(np.float64) - self.expected.astype(np.float64))

    @property
    def failing(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            bad = self.diff > self.atol + self.rtol * np.abs(self.expected)
        return bad | ~np.isfinite(self.actual) | ~np.isfinite(self.expected)


def _layout(report: Report, reference: TapSet, unit: str | None) -> list[ImageTokens]:
    """Where each image's token rows (raster order) sit in the image, as the checkpoint's family says."""
    hooks = get_family(report.data["family"]).view_hooks()
    return hooks.token_layout(reference, unit, report.data.get("plan_meta", {}))


def _as_matrix(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array, dtype=np.float32)
    return array.reshape(array.shape[0], -1) if array.ndim > 1 else array[:, None]


def _token_rows(array: np.ndarray, axes: list[str], row_axes: list[str], rows):
    """``array`` with its leading axes that together index token rows (the plan's ``row_axes``, e.g. crops and
    patches) merged into one, so that each row is one token; ``rows`` (ranges of the first axis) follow."""
    lead = 0
    while lead < min(len(axes), len(row_axes), array.ndim) and axes[lead] == row_axes[lead]:
        lead += 1
    if lead < 2:
        return array, rows
    per = int(np.prod(array.shape[1:lead]))
    merged = array.reshape(-1, *array.shape[lead:])
    return merged, None if rows is None else [(start * per, stop * per) for start, stop in rows]


def _pair_tapsets(report: Report, pair: str) -> tuple[TapSet, TapSet]:
    return report.pair_tapsets(pair)  # with the stages narrowing added to the pair


def stage_difference(report: Report, stage: str, pair: str, replay: bool = False) -> StageDifference:
    """Both sides of ``stage`` for ``pair`` (``replay``: the candidate's op-local replay instead of its run)."""
    reference, candidate = _pair_tapsets(report, pair)
    if replay:
        candidate = TapSet(report.directory / report.data["replay"][pair]["tapset"])
    row = next((r for r in report.rows if r.stage == stage and (r.pair or r.candidate) == pair), None)
    atol, rtol = (row.atol, row.rtol) if row else (0.08, 0.08)
    declaration = reference.declaration(stage)
    order = declaration.get("token_order", "none")
    alignment = align(stage, reference, candidate, orders_of(report.plan))  # active rows; orders meet in raster
    if alignment.reorders and not alignment.refusal:
        expected, actual = (_as_matrix(side) for side in alignment.arrays(reference, candidate, stage))
        order = "raster"
    else:
        axes, row_axes = list(declaration.get("axes", [])), list(report.data.get("plan_meta", {}).get("row_axes", []))
        expected = _as_matrix(
            take_rows(*_token_rows(np.asarray(reference[stage]), axes, row_axes, alignment.reference_rows))
        )
        actual = _as_matrix(
            take_rows(*_token_rows(np.asarray(candidate[stage]), axes, row_axes, alignment.candidate_rows))
        )
    rows = [(0, expected.shape[0])]
    if declaration.get("token_unit") == "patch":  # one panel per image (the token order keeps images apart)
        layout = _layout(report, reference, "patch")
        if layout and layout[-1].stop == expected.shape[0]:
            rows = [(tokens.start, tokens.stop) for tokens in layout]
    return StageDifference(stage, expected, actual, atol, rtol, order, rows)


def top_channels(difference: StageDifference, k: int = 8):
    """Channels ranked by failures then max |diff|, with the worst token and both values there."""
    import pandas as pd

    diff, failing = difference.diff, difference.failing
    per_channel = failing.sum(axis=0)
    worst = np.nanmax(np.where(np.isfinite(diff), diff, np.inf), axis=0)
    order = np.lexsort((-worst, -per_channel))[:k]
    records = []
    for channel in order:
        token = int(np.nanargmax(np.where(np.isfinite(diff[:, channel]), diff[:, channel], np.inf)))
        records.append(
            {
                "channel": int(channel),
                "failures": int(per_channel[channel]),
                "max |a - e|": float(worst[channel]),
                "mean |a - e|": float(np.nanmean(diff[:, channel])),
                "worst token": token,
                "expected": float(difference.expected[token, channel]),
                "actual": float(difference.actual[token, channel]),
            }
        )
    return pd.DataFrame(records)


def top_tokens(difference: StageDifference, k: int = 8):
    import pandas as pd

    diff, failing = difference.diff, difference.failing
    per_token = failing.sum(axis=1)
    worst = np.nanmax(np.where(np.isfinite(diff), diff, np.inf), axis=1)
    order = np.lexsort((-worst, -per_token))[:k]
    return pd.DataFrame(
        [
            {
                "token": int(t),
                "failures": int(per_token[t]),
                "max |a - e|": float(worst[t]),
                "worst channel": int(np.argmax(diff[t])),
                "expected": float(difference.expected[t].max()),
                "row |expected| max": float(np.abs(difference.expected[t]).max()),
                "row |actual| max": float(np.abs(difference.actual[t]).max()),
            }
            for t in order
        ]
    )


def failure_share(difference: StageDifference, k: int = 3) -> float:
    """Fraction of all failing elements carried by the ``k`` channels with the most failures."""
    per_channel = difference.failing.sum(axis=0)
    total = per_channel.sum()
    return float(np.sort(per_channel)[::-1][:k].sum() / total) if total else 0.0


def collapsed_rows(difference: StageDifference) -> int:
    """Rows that came out all zero (or non-finite) where the reference row is not."""
    actual, expected = difference.actual, difference.expected
    dead = (np.nan_to_num(np.abs(actual), nan=0.0).max(axis=1) == 0) | ~np.isfinite(actual).all(axis=1)
    return int((dead & (np.abs(expected).max(axis=1) > 0)).sum())


def magnitude_split(difference: StageDifference, quantile: float = 0.5) -> dict:
    """Failures among small versus large |expected| (split at the given quantile of |expected|)."""
    magnitude = np.abs(difference.expected)
    cut = float(np.quantile(magnitude, quantile))
    failing = difference.failing
    return {
        "split_at": cut,
        "failures_small": int(failing[magnitude <= cut].sum()),
        "failures_large": int(failing[magnitude > cut].sum()),
    }


def patch_error_grid(report: Report, stage: str, pair: str, image: int = 0, replay: bool = False) -> np.ndarray | None:
    """Per-patch RMS error of ``stage`` for one image, as an [h, w] grid in raster (image) layout (NaN where no
    patch is; 0 only where the patch is exactly equal); None when the stage's rows are not the image's patches
    (a text stage: one row per prompt token)."""
    if stage.startswith("text."):
        return None  # one row per prompt token (or a cache's layer): no image's patches to draw
    difference = stage_difference(report, stage, pair, replay)
    reference, _ = _pair_tapsets(report, pair)
    per_row = np.sqrt(np.mean(difference.diff**2, axis=1))
    unit = reference.declaration(stage).get("token_unit")
    order = TokenOrder.of(report.plan, difference.token_order)
    if order is not None and order.index in reference:  # back to raster order with the reference's own index
        per_row = order.to_raster(per_row, np.asarray(reference[order.index]), unit)
    layout = _layout(report, reference, unit)
    if image >= len(layout) or len(per_row) < layout[image].stop:
        return None  # the stage's rows are not that image's patches (a family lays out no token of this unit)
    tokens = layout[image]
    values = per_row[tokens.start : tokens.stop]
    grid = np.full(tokens.shape, np.nan)  # a cell no patch covers: a gap, not an error of 0
    grid[tokens.cells[:, 0], tokens.cells[:, 1]] = values[: len(tokens.cells)]
    return grid
