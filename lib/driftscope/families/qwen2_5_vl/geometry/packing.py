"""Packing several images into one fixed-size bucket of patch rows, in window order, with segments.

Rows ``[0, active)`` hold the images one after another, each in its own window order (exactly the
layout the reference runs in); rows ``[active, rows)`` are padding. Segment ids drive the masks:
a row attends to rows with the same id; every padded row has an id of its own, so it sees only
itself and never feeds an active row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...qwen_shared.grids import bucket_rows
from .windows import _grids, cu_seqlens, position_ids, window_layout


@dataclass(frozen=True)
class Bucket:
    """Host-side index arrays for one packed call (all int32, ready to be graph inputs)."""

    rows: int  # patch rows in the bucket
    active: int  # rows holding real patches
    merge_unit: int
    patch_gather: np.ndarray  # [rows] raster row to read for each window-order row (padding reads itself)
    positions: np.ndarray  # [rows, 2] (h, w) of each raster row (padding: 0)
    window_segments: np.ndarray  # [rows] window id per window-order row (padding: unique negatives)
    image_segments: np.ndarray  # [rows] frame id per window-order row (padding: unique negatives)
    merged_restore: np.ndarray  # [rows / merge_unit] window-order merged row to read for each raster one
    window_index: np.ndarray  # [active / merge_unit] the reference's window index
    cu_window_seqlens: np.ndarray  # bounds, empty windows dropped
    cu_window_seqlens_raw: np.ndarray
    cu_seqlens: np.ndarray

    @property
    def active_rows(self) -> list[list[int]]:
        return [[0, self.active]]

    @property
    def active_merged(self) -> int:
        return self.active // self.merge_unit

    def graph_inputs(self) -> dict[str, np.ndarray]:
        return {
            "patch_gather": self.patch_gather,
            "positions": self.positions,
            "window_segments": self.window_segments,
            "image_segments": self.image_segments,
            "merged_restore": self.merged_restore,
        }


def _segments(bounds: np.ndarray, active: int, rows: int) -> np.ndarray:
    segment = np.empty(rows, dtype=np.int32)
    lengths = np.diff(bounds)
    segment[:active] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    segment[active:] = -1 - np.arange(rows - active, dtype=np.int32)
    return segment


def pack_images(
    grid_thw,
    rows: int | None = None,
    spatial_merge_size: int = 2,
    window_size: int = 112,
    patch_size: int = 14,
) -> Bucket:
    """Index arrays that pack the images of ``grid_thw`` into ``rows`` patch rows (default: exactly enough)."""
    grids = _grids(grid_thw)
    unit = spatial_merge_size**2
    active, rows = bucket_rows(grids, rows, unit)
    layout = window_layout(grids, spatial_merge_size, window_size, patch_size)
    merged = rows // unit
    merged_active = active // unit
    merged_order = np.concatenate([layout.window_index, np.arange(merged_active, merged)])
    gather = (merged_order[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
    restore = np.argsort(merged_order, kind="stable")
    positions = np.zeros((rows, 2), dtype=np.int32)
    positions[:active] = position_ids(grids, spatial_merge_size)
    full = cu_seqlens(grids)
    return Bucket(
        rows=rows,
        active=active,
        merge_unit=unit,
        patch_gather=gather.astype(np.int32),
        positions=positions,
        window_segments=_segments(layout.cu_window_seqlens, active, rows),
        image_segments=_segments(full, active, rows),
        merged_restore=restore.astype(np.int32),
        window_index=layout.window_index,
        cu_window_seqlens=layout.cu_window_seqlens,
        cu_window_seqlens_raw=layout.cu_window_seqlens_raw,
        cu_seqlens=full,
    )
