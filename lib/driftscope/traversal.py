"""Window traversal: two engines may visit the same windows in different orders and both be right.

``vision.window_index`` is judged by what it means, not element by element: the set of merged tokens in each
window (windows delimited by that side's own ``vision.cu_window_seqlens``), and the raster order each side's
index restores (every merged token exactly once). When only the order of the windows (or of the tokens
inside one) differs, the traversal is *equivalent*: both stages pass with a note saying so. A window whose
membership differs, or an index that does not restore every token once, fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import WINDOW_INDEX
from .tapset import TapSet

WINDOW_BOUNDS = "vision.cu_window_seqlens"
STAGES = (WINDOW_INDEX, WINDOW_BOUNDS)


@dataclass(frozen=True)
class Traversal:
    status: str  # equal | equivalent | different
    note: str


def windows(index: np.ndarray, bounds: np.ndarray, merge_unit: int) -> list[frozenset[int]]:
    """The merged tokens of each non-empty window (``bounds`` in patches, as attention uses them)."""
    edges = np.asarray(bounds, dtype=np.int64) // merge_unit
    return [frozenset(index[a:b].tolist()) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def _restores_raster(index: np.ndarray) -> bool:
    """Whether restoring with ``index`` (``rows[argsort(index)]``) yields every raster token exactly once."""
    return bool(np.array_equal(index[np.argsort(index, kind="stable")], np.arange(len(index))))


def judge_traversal(reference: TapSet, candidate: TapSet, merge_unit: int) -> Traversal | None:
    """Equal, equivalent or different traversal; None when a side lacks the index or the bounds."""
    if not all(stage in side for stage in STAGES for side in (reference, candidate)):
        return None
    ref_index, cand_index = (np.asarray(side[WINDOW_INDEX]).reshape(-1) for side in (reference, candidate))
    ref_bounds, cand_bounds = (np.asarray(side[WINDOW_BOUNDS]).reshape(-1) for side in (reference, candidate))
    if np.array_equal(ref_index, cand_index) and np.array_equal(ref_bounds, cand_bounds):
        return Traversal("equal", "")
    for name, index, bounds in (("reference", ref_index, ref_bounds), ("candidate", cand_index, cand_bounds)):
        if not _restores_raster(index):
            return Traversal(
                "different", f"the {name}'s {WINDOW_INDEX} does not restore raster order (a token missing or repeated)"
            )
        if bounds.size == 0 or bounds[-1] != len(index) * merge_unit:
            return Traversal("different", f"the {name}'s {WINDOW_BOUNDS} do not end at its {len(index)} merged tokens")
    if len(ref_index) != len(cand_index):
        return Traversal(
            "different", f"{len(ref_index)} merged tokens in the reference, {len(cand_index)} in the candidate"
        )
    ref_windows, cand_windows = windows(ref_index, ref_bounds, merge_unit), windows(cand_index, cand_bounds, merge_unit)
    missing = [position for position, window in enumerate(ref_windows) if window not in set(cand_windows)]
    if missing or len(ref_windows) != len(cand_windows):
        first = ref_windows[missing[0]] if missing else frozenset()
        return Traversal(
            "different",
            f"window membership differs: {len(missing)} of the reference's {len(ref_windows)} windows are not windows "
            f"of the candidate (the first, window {missing[0] if missing else '-'}, holds merged tokens "
            f"{sorted(first)[:8]}); the candidate has {len(cand_windows)} windows",
        )
    return Traversal(
        "equivalent",
        f"equivalent traversal: the same {len(ref_windows)} windows with the same tokens, visited in another order; "
        "both sides restore the same raster order",
    )
