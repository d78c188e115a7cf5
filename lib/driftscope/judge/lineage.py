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


def _order(tapset, stage_id: str, orders: dict[str, TokenOrder]) -> TokenOrder | None:
    name = tapset.declaration(stage_id).get("token_order")
    return orders.get(name) if name not in (None, "none", "raster") else None


def _active_to_stored(ranges: list[tuple[int, int]], index: int) -> int | None:
    for start, stop in ranges:
        if index < stop - start:
            return start + index
        index -= stop - start
    return None


def stored_row(tapset, stage_id: str, raster: int, orders: dict[str, TokenOrder]) -> int | None:
    """Where raster row ``raster`` (of the stage's own unit, over its active rows) is stored on this side."""
    shape = tapset.shape(stage_id)
    declaration = tapset.declaration(stage_id)
    ranges = active_ranges(declaration, shape[0])
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


def raster_row(reference, candidate, stage_id: str, row: int, orders: dict[str, TokenOrder]) -> int | None:
    """The raster row (over active rows) of a reported coordinate's row: a reordered comparison reports raster
    coordinates already; otherwise they are the reference's stored coordinates."""
    alignment = align(stage_id, reference, candidate, orders)
    if alignment.reorders:
        return row
    ranges = alignment.reference_rows
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
    start = raster_row(reference, candidate, stage_id, int(coords[0]), orders)
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
        size = per_unit.get(stage.token_unit, 1)
        rasters = sorted({patch // size for patch in patches})
        sides = [[stored_row(tapset, stage.id, r, orders) for r in rasters] for tapset in (reference, candidate)]
        if any(row is None for side in sides for row in side):
            continue
        expected = np.concatenate([reference.rows(stage.id, r, r + 1) for r in sides[0]])
        actual = np.concatenate([candidate.rows(stage.id, r, r + 1) for r in sides[1]])
        tolerance = contract.tolerance(stage.id)
        entries.append(
            {
                "stage": stage.id,
                "unit": stage.token_unit,
                "rows": sides[0],
                **_row_error(expected, actual, tolerance.atol, tolerance.rtol),
            }
        )
    return {"stage": stage_id, "coords": [int(c) for c in coords], "raster_row": start, "unit": unit, "stages": entries}
