"""The first divergence's token row, followed backwards through every earlier captured stage of the pair.

The element the report names at a pair's first divergence (the failing element furthest over its tolerance)
sits in one token row. That token is found again in every earlier stage both sides captured, from the stored
taps (no rerun): stages are stored in their own token order (raster, or a family's order such as attention
windows, restored with each side's own index stage) and unit (a patch row, or a merged token covering several
patch rows), so the row is mapped through raster patch rows. The row's error at each stage, in execution order,
shows where it began: a row that fails at layer 24 may already have been off at layer 18.
"""

from __future__ import annotations

import numpy as np

from driftscope.judge.contract import Contract
from driftscope.judge.layout import active_ranges, align, count
from driftscope.taps.stages import StagePlan, TokenOrder, orders_of
from driftscope.taps.tapset import TapSet


def patch_rows_per_unit(plan: StagePlan) -> dict[str, int]:
    """How many patch rows one row of each token unit covers: ``plan.meta["token_units"]`` where the family
    declares it, else read off its token orders (rows per index entry of each unit), else one each."""
    declared = plan.meta.get("token_units")
    if declared:
        return {unit: int(rows) for unit, rows in declared.items()}
    for order in orders_of(plan).values():
        per = order.rows_per_index
        if "patch" in per:
            return {unit: max(int(per["patch"]) // max(int(rows), 1), 1) for unit, rows in per.items()}
    return {"patch": 1}


def row_axis_count(plan: StagePlan, stage_id: str) -> int:
    """How many leading axes of ``stage_id`` together index its token rows: those of its axes that begin the plan's
    ``row_axes`` (e.g. ``crops, patches``: 2 on a ViT stage, 1 on a pooled one), at least 1."""
    declared, axes, lead = list(plan.meta.get("row_axes") or []), plan[stage_id].axes, 0
    while lead < min(len(declared), len(axes)) and axes[lead] == declared[lead]:
        lead += 1
    return max(lead, 1)


class _Rows:
    """One side's stage read as token rows over its ``lead`` leading axes (raveled), so a crop's patch is a row."""

    def __init__(self, tapset, stage_id: str, lead: int):
        self.tapset, self.stage_id, self.lead = tapset, stage_id, lead
        self.shape = tuple(tapset.shape(stage_id))

    @property
    def length(self) -> int:
        return int(np.prod(self.shape[: self.lead], dtype=np.int64)) if self.shape else 1

    def row(self, index: int) -> np.ndarray:
        if self.lead == 1:
            return self.tapset.rows(self.stage_id, index, index + 1)
        at = np.unravel_index(index, self.shape[: self.lead])
        outer = self.tapset.rows(self.stage_id, int(at[0]), int(at[0]) + 1)[0]
        return outer[tuple(int(i) for i in at[1:])][None]


def _order(tapset, stage_id: str, orders: dict[str, TokenOrder]) -> TokenOrder | None:
    name = tapset.declaration(stage_id).get("token_order")
    return orders.get(name) if name not in (None, "none", "raster") else None


def _active_to_stored(ranges: list[tuple[int, int]], index: int) -> int | None:
    for start, stop in ranges:
        if index < stop - start:
            return start + index
        index -= stop - start
    return None


def stored_row(
    tapset, stage_id: str, raster: int, orders: dict[str, TokenOrder], length: int | None = None
) -> int | None:
    """Where raster row ``raster`` (of the stage's own unit, over its active rows) is stored on this side;
    ``length``: the stage's rows when they span several leading axes (default: its first axis)."""
    shape = tapset.shape(stage_id)
    declaration = tapset.declaration(stage_id)
    ranges = active_ranges(declaration, shape[0] if length is None else length)
    order = _order(tapset, stage_id, orders)
    index = raster
    if order is not None:
        if order.index not in tapset:
            return None
        unit = declaration.get("token_unit")
        group = order.group(unit)
        permutation = np.asarray(tapset[order.index]).reshape(-1)
        if not order.is_permutation(permutation, count(ranges), unit):
            return None
        reverse = np.argsort(permutation, kind="stable")
        index = int(reverse[raster // group]) * group + raster % group
    return _active_to_stored(ranges, index)


def raster_row(
    reference, candidate, stage_id: str, row: int, orders: dict[str, TokenOrder], length: int | None = None
) -> int | None:
    """The raster row (over active rows) of a reported coordinate's row: a reordered comparison reports raster
    coordinates already; otherwise they are the reference's stored coordinates. ``row``: already raveled over the
    stage's row axes when they are several (``length`` rows in all)."""
    alignment = align(stage_id, reference, candidate, orders)
    if alignment.reorders:
        return row
    ranges = alignment.reference_rows if length is None else active_ranges(reference.declaration(stage_id), length)
    offset = 0
    for start, stop in ranges:
        if start <= row < stop:
            index = offset + row - start
            break
        offset += stop - start
    else:
        return None
    order = _order(reference, stage_id, orders)
    if order is None:
        return index
    unit = reference.declaration(stage_id).get("token_unit")
    group = order.group(unit)
    permutation = np.asarray(reference[order.index]).reshape(-1)
    return int(permutation[index // group]) * group + index % group


def _row_error(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> dict:
    e, a = expected.astype(np.float64).ravel(), actual.astype(np.float64).ravel()
    finite = np.isfinite(e) & np.isfinite(a)
    diff = np.where(finite, np.abs(a - e), np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = diff / (atol + rtol * np.abs(np.where(finite, e, 0.0)))
    rms = float(np.sqrt(np.mean(np.where(finite, diff, 0.0) ** 2))) if diff.size else 0.0
    scale = float(np.sqrt(np.mean(np.where(finite, e, 0.0) ** 2))) if e.size else 0.0
    return {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "rms": rms,
        "relative_rms": rms / scale if scale > 0 else (0.0 if rms == 0 else float("inf")),
        "max_excess": float(excess.max()) if excess.size else 0.0,
        "failures": int(np.count_nonzero(diff > atol + rtol * np.abs(e))),
        "elements": int(e.size),
    }


def row_lineage(
    reference: TapSet, candidate: TapSet, plan: StagePlan, contract: Contract, stage_id: str, coords: list[int]
) -> dict | None:
    """The error of the token row holding ``coords`` of ``stage_id`` at every earlier stage on the activation path
    (no data or side stages) both sides captured, in execution order (None when the stage has no token rows)."""
    if stage_id not in plan or not coords or plan[stage_id].token_unit is None:
        return None
    orders = orders_of(plan)
    lead = min(row_axis_count(plan, stage_id), len(coords))
    rows = _Rows(reference, stage_id, lead)
    flat = int(np.ravel_multi_index([int(c) for c in coords[:lead]], rows.shape[:lead])) if lead > 1 else int(coords[0])
    start = raster_row(reference, candidate, stage_id, flat, orders, rows.length if lead > 1 else None)
    if start is None:
        return None
    per_unit = patch_rows_per_unit(plan)
    unit = plan[stage_id].token_unit
    first_patch = start * per_unit.get(unit, 1)
    patches = range(first_patch, first_patch + per_unit.get(unit, 1))
    entries = []
    for stage in plan.stages[: plan.position(stage_id) + 1]:
        if stage.token_unit is None or stage.integer or stage.data or stage.side:
            continue  # the activation path only
        if stage.id not in reference or stage.id not in candidate:
            continue
        if stage.token_unit != unit and not {stage.token_unit, unit} <= set(per_unit):
            continue  # a unit the plan gives no patch rows for (pooled tokens): no row to map to
        size = per_unit.get(stage.token_unit, 1)
        rasters = sorted({patch // size for patch in patches})
        count_of = row_axis_count(plan, stage.id)
        sided = [_Rows(tapset, stage.id, count_of) for tapset in (reference, candidate)]
        length = sided[0].length if count_of > 1 else None
        sides = [[stored_row(s.tapset, stage.id, r, orders, length) for r in rasters] for s in sided]
        if any(row is None for side in sides for row in side):
            continue
        expected = np.concatenate([sided[0].row(r) for r in sides[0]])
        actual = np.concatenate([sided[1].row(r) for r in sides[1]])
        tolerance = contract.tolerance(stage.id)
        entries.append(
            {
                "stage": stage.id,
                "unit": stage.token_unit,
                "rows": sides[0],
                **_row_error(expected, actual, tolerance.atol, tolerance.rtol),
            }
        )
    found = {"stage": stage_id, "coords": [int(c) for c in coords], "raster_row": start, "unit": unit}
    if lead > 1:  # where the row sits over the axes that index it, e.g. {"crops": 0, "patches": 264}
        found["row_at"] = {axis: int(c) for axis, c in zip(plan[stage_id].axes[:lead], coords[:lead], strict=True)}
    return {**found, "stages": entries}
