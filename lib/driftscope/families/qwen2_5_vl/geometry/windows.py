"""Qwen2.5-VL window attention geometry: window index, window and image bounds, rotary positions.

Everything here is integer numpy, written from the definition (not by calling transformers), so
tests can hold it against ``transformers.vision_utils`` as an independent reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...qwen_shared.grids import cu_seqlens, position_ids  # noqa: F401 (this module's names before they were shared)
from ...qwen_shared.grids import grids_of as _grids


def unique_consecutive(bounds: np.ndarray) -> np.ndarray:
    """Window bounds without repeats: an empty window (a repeated bound) attends to nothing."""
    bounds = np.asarray(bounds)
    if bounds.size == 0:
        return bounds
    keep = np.concatenate([[True], bounds[1:] != bounds[:-1]])
    return bounds[keep]


def merger_window(window_size: int, spatial_merge_size: int, patch_size: int) -> int:
    """Window side in merged tokens (112 px / 2 / 14 = 4 for Qwen2.5-VL)."""
    return window_size // spatial_merge_size // patch_size


@dataclass(frozen=True)
class WindowLayout:
    """Window permutation of merged tokens and the window bounds in patches, for a list of images."""

    window_index: np.ndarray  # [merged tokens] merged-token raster index at each window-order position
    cu_window_seqlens_raw: np.ndarray  # bounds in patches, one per window including empty padded ones
    windows_per_image: tuple[int, ...]  # non-empty windows
    partial_windows: tuple[int, ...]  # windows per image that are only partly filled (padded)
    empty_windows: tuple[int, ...]  # all-padding windows the reference still emits (dropped bounds)

    @property
    def cu_window_seqlens(self) -> np.ndarray:
        """Bounds with empty windows dropped (what attention uses)."""
        return unique_consecutive(self.cu_window_seqlens_raw)


def window_layout(grid_thw, spatial_merge_size: int = 2, window_size: int = 112, patch_size: int = 14) -> WindowLayout:
    """The window index and bounds, image after image (each image's merged grid padded to whole windows)."""
    side = merger_window(window_size, spatial_merge_size, patch_size)
    unit = spatial_merge_size**2
    indices, bounds, per_image, partial, empty = [], [0], [], [], []
    offset = 0
    for t, h, w in _grids(grid_thw):
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        # the reference pads by a whole window even when the grid is a multiple of it (empty windows)
        ph, pw = side - gh % side, side - gw % side
        nh, nw = (gh + ph) // side, (gw + pw) // side
        grid = np.full((t, gh + ph, gw + pw), -1, dtype=np.int64)
        grid[:, :gh, :gw] = np.arange(t * gh * gw).reshape(t, gh, gw)
        tiles = grid.reshape(t, nh, side, nw, side).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, side * side)
        counts = (tiles >= 0).sum(-1).reshape(-1)
        flat = tiles.reshape(-1)
        indices.append(flat[flat >= 0] + offset)
        bounds.extend((np.cumsum(counts) * unit + bounds[-1]).tolist())
        per_image.append(int((counts > 0).sum()))
        partial.append(int(((counts > 0) & (counts < side * side)).sum()))
        empty.append(int((counts == 0).sum()))
        offset += t * gh * gw
    index = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    return WindowLayout(index, np.asarray(bounds, dtype=np.int64), tuple(per_image), tuple(partial), tuple(empty))


def window_index(grid_thw, spatial_merge_size: int = 2, window_size: int = 112, patch_size: int = 14) -> np.ndarray:
    return window_layout(grid_thw, spatial_merge_size, window_size, patch_size).window_index


def cu_window_seqlens(
    grid_thw, spatial_merge_size: int = 2, window_size: int = 112, patch_size: int = 14
) -> np.ndarray:
    return window_layout(grid_thw, spatial_merge_size, window_size, patch_size).cu_window_seqlens


def reverse_by_argsort(index: np.ndarray) -> np.ndarray:
    """The correct un-reorder: ``restored = permuted[argsort(index)]``."""
    return np.argsort(np.asarray(index), kind="stable")


def reverse_by_rank_scatter(index: np.ndarray) -> np.ndarray:
    """The construction a real engine shipped: ``for orig, rank in enumerate(index): reverse[orig] = rank``.

    It reads the window index's positions as original tokens and its values as ranks, so the
    "reverse" is the window permutation itself and restoring applies the permutation twice. It
    equals :func:`reverse_by_argsort` only when the permutation is an involution; kept by name
    so audits can count what it misplaces.
    """
    index = np.asarray(index)
    reverse = np.empty_like(index)
    for orig, rank in enumerate(index):
        reverse[orig] = rank
    return reverse


def is_involution(index: np.ndarray) -> bool:
    """Whether applying the permutation twice is the identity (then a twice-applied un-reorder hides)."""
    index = np.asarray(index)
    return bool(np.array_equal(index[index], np.arange(len(index))))


def misplaced_tokens(index: np.ndarray, reverse: np.ndarray) -> int:
    """Merged tokens a restoring gather ``permuted[reverse]`` puts in the wrong raster place."""
    index, reverse = np.asarray(index), np.asarray(reverse)
    return int((index[reverse] != np.arange(len(index))).sum())


@dataclass(frozen=True)
class UnreorderAudit:
    grid_thw: tuple[int, int, int]
    merged_tokens: int
    windows: int
    partial_windows: int
    empty_windows: int
    involution: bool
    identity: bool
    misplaced_by_rank_scatter: int
    misplaced_by_argsort: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def audit_unreorder(
    grid_thw, spatial_merge_size: int = 2, window_size: int = 112, patch_size: int = 14
) -> UnreorderAudit:
    """For one image grid: is the window permutation an involution, and what each un-reorder misplaces."""
    grids = _grids(grid_thw)
    layout = window_layout(grids, spatial_merge_size, window_size, patch_size)
    index = layout.window_index
    return UnreorderAudit(
        grid_thw=grids[0] if len(grids) == 1 else tuple(map(tuple, grids)),
        merged_tokens=int(len(index)),
        windows=sum(layout.windows_per_image),
        partial_windows=sum(layout.partial_windows),
        empty_windows=sum(layout.empty_windows),
        involution=is_involution(index),
        identity=bool(np.array_equal(index, np.arange(len(index)))),
        misplaced_by_rank_scatter=misplaced_tokens(index, reverse_by_rank_scatter(index)),
        misplaced_by_argsort=misplaced_tokens(index, reverse_by_argsort(index)),
    )
