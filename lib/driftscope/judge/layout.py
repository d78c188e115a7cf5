"""How two TapSets' rows line up for one stage: their active rows and their token orders.

Token orders (docs/tapfile.md): ``raster`` is the processor's row order; a family may declare other orders in
its plan (``StagePlan.meta["token_orders"]``, read as :class:`~driftscope.taps.stages.TokenOrder`): rows permuted
group by group by an integer index stage each side captures. Two sides in different orders are brought to
raster order with the permutation the inputs imply (the permuted side's own index, else the other side's);
with no permutation to use, the stage is refused as a layout mismatch rather than compared element by
element as if it were numerical drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import TokenOrder
from driftscope.taps.tapset import TapSet

Ranges = list[tuple[int, int]]


def active_ranges(declaration: dict, length: int) -> Ranges:
    """The declared ``active_rows`` ranges, or every row."""
    ranges = declaration.get("active_rows")
    if not ranges:
        return [(0, length)]
    return [(int(start), int(stop)) for start, stop in ranges]


def count(ranges: Ranges) -> int:
    return sum(stop - start for start, stop in ranges)


def paired_segments(first: Ranges, second: Ranges) -> list[tuple[int, int, int]]:
    """``(start in first, start in second, length)`` runs that walk both range lists in step."""
    a, b = [list(r) for r in first], [list(r) for r in second]
    segments, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        length = min(a[i][1] - a[i][0], b[j][1] - b[j][0])
        if length > 0:
            segments.append((a[i][0], b[j][0], length))
        a[i][0] += length
        b[j][0] += length
        if a[i][0] >= a[i][1]:
            i += 1
        if b[j][0] >= b[j][1]:
            j += 1
    return segments


def take_rows(array: np.ndarray, ranges: Ranges) -> np.ndarray:
    """The rows of ``ranges``, concatenated (the array itself when that is every row)."""
    if array.ndim == 0 or ranges == [(0, array.shape[0])]:
        return array
    return np.concatenate([array[start:stop] for start, stop in ranges])


@dataclass
class Alignment:
    """For one stage: each side's active rows, the index restoring each side to raster (None: compare as
    stored), a note for the row, and ``refusal`` when the two layouts cannot be brought together."""

    reference_rows: Ranges
    candidate_rows: Ranges
    reference_index: np.ndarray | None = None
    candidate_index: np.ndarray | None = None
    unit: str | None = None
    order: TokenOrder | None = None
    note: str = ""
    refusal: str | None = None

    @property
    def reorders(self) -> bool:
        return self.reference_index is not None or self.candidate_index is not None

    def arrays(self, reference: TapSet, candidate: TapSet, stage_id: str):
        """Both sides' active rows, in raster order where a side is restored."""
        out = []
        for tapset, ranges, index in (
            (reference, self.reference_rows, self.reference_index),
            (candidate, self.candidate_rows, self.candidate_index),
        ):
            array = take_rows(np.asarray(tapset[stage_id]), ranges)
            out.append(array if index is None else self.order.to_raster(array, index, self.unit))
        return out


def _order(declaration: dict, fallback: str) -> str:
    order = declaration.get("token_order")
    return fallback if order in (None, "none") else order


def align(stage_id: str, reference: TapSet, candidate: TapSet, orders: dict[str, TokenOrder]) -> Alignment:
    """How ``stage_id``'s rows line up between the two sides (see the module docstring); ``orders``: the
    plan's non-raster token orders by name (``stages.orders_of``)."""
    ref_decl, cand_decl = reference.declaration(stage_id), candidate.declaration(stage_id)
    ref_shape, cand_shape = reference.shape(stage_id), candidate.shape(stage_id)
    alignment = Alignment(
        active_ranges(ref_decl, ref_shape[0] if ref_shape else 1),
        active_ranges(cand_decl, cand_shape[0] if cand_shape else 1),
        unit=ref_decl.get("token_unit") or cand_decl.get("token_unit"),
    )
    ref_order = _order(ref_decl, "none")
    cand_order = _order(cand_decl, ref_order)  # an engine that declares no order is read in the reference's
    permuted = [name for name in (ref_order, cand_order) if name not in ("raster", "none")]
    if not permuted:
        return alignment
    if len(set(permuted)) > 1:
        alignment.refusal = f"layout mismatch: candidate {cand_order}, reference {ref_order}"
        return alignment
    order = orders.get(permuted[0])
    if order is None:  # an order the plan does not declare: nothing to restore with, compared as stored
        if ref_order != cand_order:
            alignment.refusal = (
                f"layout mismatch: candidate {cand_order}, reference {ref_order}, and the stage plan declares no "
                f"way to restore {permuted[0]!r} order"
            )
        return alignment
    alignment.order = order
    rows = count(alignment.reference_rows)
    indices = [np.asarray(t[order.index]).reshape(-1) if order.index in t else None for t in (reference, candidate)]
    valid = [i is not None and order.is_permutation(i, rows, alignment.unit) for i in indices]
    if ref_order == cand_order:
        if all(valid) and not np.array_equal(indices[0], indices[1]):
            alignment.reference_index, alignment.candidate_index = indices
            alignment.note = (
                f"{ref_order} orders differ: both sides restored to raster order with their own {order.index}"
            )
        return alignment
    names = ("reference", "candidate")
    own = 0 if ref_order == permuted[0] else 1
    other = 1 - own
    chosen = own if valid[own] else other if valid[other] else None
    if chosen is None:
        alignment.refusal = (
            f"layout mismatch: candidate {cand_order}, reference {ref_order}, and no valid {order.index} on either "
            "side to reorder with"
        )
        return alignment
    if own == 0:
        alignment.reference_index = indices[chosen]
    else:
        alignment.candidate_index = indices[chosen]
    alignment.note = (
        f"layout: candidate {cand_order}, reference {ref_order}: the {names[own]} restored to raster "
        f"order with the {names[chosen]}'s {order.index}"
    )
    return alignment
