"""Segment traversal: two engines may visit the same segments in different orders and both be right.

A token order that visits segments (a family's ``TokenOrder`` with ``segments``, e.g. attention windows)
is judged by what it means, not element by element: the set of index entries in each segment (delimited by
that side's own bounds stage), and the raster order each side's index restores (every entry exactly once).
When only the order of the segments (or of the entries inside one) differs, the traversal is *equivalent*:
the index and bounds stages pass with a note saying so. A segment whose membership differs, or an index that
does not restore every entry once, fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.stages import TokenOrder
from driftscope.taps.tapset import TapSet


@dataclass(frozen=True)
class Traversal:
    status: str  # equal | equivalent | different
    note: str


def traversal_order(orders: dict[str, TokenOrder], stage_id: str) -> TokenOrder | None:
    """The order whose index or segment bounds ``stage_id`` is (those stages are judged by meaning)."""
    return next((o for o in orders.values() if o.segments and stage_id in (o.index, o.segments)), None)


def segments(index: np.ndarray, bounds: np.ndarray, group: int) -> list[frozenset[int]]:
    """The index entries of each non-empty segment (``bounds`` in rows of ``group`` rows per entry)."""
    edges = np.asarray(bounds, dtype=np.int64) // max(group, 1)
    return [frozenset(index[a:b].tolist()) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def _restores_raster(index: np.ndarray) -> bool:
    """Whether restoring with ``index`` (``rows[argsort(index)]``) yields every raster entry exactly once."""
    return bool(np.array_equal(index[np.argsort(index, kind="stable")], np.arange(len(index))))


def judge_traversal(reference: TapSet, candidate: TapSet, order: TokenOrder) -> Traversal | None:
    """Equal, equivalent or different traversal; None when a side lacks the index or the bounds."""
    stages = (order.index, order.segments)
    if not all(stage in side for stage in stages for side in (reference, candidate)):
        return None
    group = order.group(order.segment_unit)
    ref_index, cand_index = (np.asarray(side[order.index]).reshape(-1) for side in (reference, candidate))
    ref_bounds, cand_bounds = (np.asarray(side[order.segments]).reshape(-1) for side in (reference, candidate))
    if np.array_equal(ref_index, cand_index) and np.array_equal(ref_bounds, cand_bounds):
        return Traversal("equal", "")
    for name, index, bounds in (("reference", ref_index, ref_bounds), ("candidate", cand_index, cand_bounds)):
        if not _restores_raster(index):
            return Traversal(
                "different", f"the {name}'s {order.index} does not restore raster order (an entry missing or repeated)"
            )
        if bounds.size == 0 or bounds[-1] != len(index) * group:
            return Traversal("different", f"the {name}'s {order.segments} do not end at its {len(index)} entries")
    if len(ref_index) != len(cand_index):
        return Traversal(
            "different", f"{len(ref_index)} index entries in the reference, {len(cand_index)} in the candidate"
        )
    ref_segments, cand_segments = segments(ref_index, ref_bounds, group), segments(cand_index, cand_bounds, group)
    missing = [position for position, segment in enumerate(ref_segments) if segment not in set(cand_segments)]
    if missing or len(ref_segments) != len(cand_segments):
        first = ref_segments[missing[0]] if missing else frozenset()
        return Traversal(
            "different",
            f"segment membership differs: {len(missing)} of the reference's {len(ref_segments)} segments of "
            f"{order.segments} are not segments of the candidate (the first, segment {missing[0] if missing else '-'}, "
            f"holds entries {sorted(first)[:8]}); the candidate has {len(cand_segments)} segments",
        )
    return Traversal(
        "equivalent",
        f"equivalent traversal: the same {len(ref_segments)} segments ({order.segments}) with the same entries, "
        "visited in another order; both sides restore the same raster order",
    )
