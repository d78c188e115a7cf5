"""Qwen3-VL vision geometry: position-embedding interpolation, rotary positions, packed buckets (numpy).

The learned position table is a square ``side x side`` grid (``side = sqrt(num_position_embeddings)``),
resampled to each image's patch grid bilinearly with ``align_corners=True`` (the corners of the
image grid land on the corners of the table) and laid out in the processor's 2x2-merge order.
Written from the definition in float32 (the same operations transformers does, so indices and
weights agree bit for bit), and tested against ``transformers.vision_utils``.

There are no windows: every block attends over the whole image, so a packed bucket needs one
segment id per image frame and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.errors import InputError

from ..qwen_shared.grids import bucket_rows, cu_seqlens, position_ids
from ..qwen_shared.grids import grids_of as _grids

__all__ = [
    "VisionBucket",
    "axis_taps",
    "cu_seqlens",
    "grid_side",
    "interpolation",
    "lands_on_table_rows",
    "merge_order_coordinates",
    "nearest_indices",
    "pack_bucket",
    "position_ids",
]


def grid_side(num_position_embeddings: int) -> int:
    """Side of the square learned table; a table that is not square is refused."""
    side = int(round(num_position_embeddings**0.5))
    if side * side != num_position_embeddings:
        raise InputError(
            f"num_position_embeddings {num_position_embeddings} is not a square",
            "Qwen3-VL's position table is side x side (2304 = 48 x 48): fix the checkpoint's vision_config",
        )
    return side


def merge_order_coordinates(h: int, w: int, merge: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of every patch of one frame in the processor's order (merge block after merge block)."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)


def axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Two taps (floor, floor + 1, clamped) into a ``side``-long axis and their bilinear weights, for
    ``index`` positions on an axis of ``size``: ``src = index * (side - 1) / (size - 1)`` in float32."""
    src = np.asarray(index, np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    distance = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    weights = np.maximum(np.float32(1) - distance, np.float32(0)).astype(np.float32)
    return taps, weights


def interpolation(grid_thw, num_grid_per_side: int, merge: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Per patch (processor order, images one after another, frames repeated): 4 table rows and weights.

    Tap order is (top-left, top-right, bottom-left, bottom-right); the weights of a patch sum to 1.
    Returns ``(indices [patches, 4] int64, weights [patches, 4] float32)``.
    """
    indices, weights = [], []
    for t, h, w in _grids(grid_thw):
        row, col = merge_order_coordinates(h, w, merge)
        h_taps, h_weights = axis_taps(row, h, num_grid_per_side)
        w_taps, w_weights = axis_taps(col, w, num_grid_per_side)
        index = (h_taps[:, :, None] * num_grid_per_side + w_taps[:, None, :]).reshape(-1, 4)
        weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
        indices.append(np.tile(index, (t, 1)))
        weights.append(np.tile(weight, (t, 1)))
    if not indices:
        return np.zeros((0, 4), np.int64), np.zeros((0, 4), np.float32)
    return np.concatenate(indices), np.concatenate(weights).astype(np.float32)


def nearest_indices(grid_thw, num_grid_per_side: int, merge: int = 2) -> np.ndarray:
    """Per patch (processor order), the one table row nearest to its align-corners position: what a
    nearest-neighbour resampling of the table reads instead of the bilinear blend of four rows."""
    indices = []
    for t, h, w in _grids(grid_thw):
        row, col = merge_order_coordinates(h, w, merge)
        scale_h = np.float32(num_grid_per_side - 1) / np.float32(max(h - 1, 1))
        scale_w = np.float32(num_grid_per_side - 1) / np.float32(max(w - 1, 1))
        rows = np.rint(row.astype(np.float32) * scale_h).astype(np.int64)
        cols = np.rint(col.astype(np.float32) * scale_w).astype(np.int64)
        indices.append(np.tile(rows * num_grid_per_side + cols, t))
    return np.concatenate(indices) if indices else np.zeros(0, np.int64)


def lands_on_table_rows(grid_thw, num_grid_per_side: int) -> bool:
    """Whether every patch of every image sits exactly on a table row (all bilinear weights 0 or 1, e.g. a
    48x48 grid on a 48x48 table): then bilinear and nearest resampling read the same rows."""
    _, weights = interpolation(grid_thw, num_grid_per_side)
    return bool(np.isin(weights, (0.0, 1.0)).all())


@dataclass(frozen=True)
class VisionBucket:
    """Host-side arrays for one packed call of the vision tower (ready to be graph inputs).

    Rows ``[0, active)`` hold the images one after another in processor order; rows ``[active, rows)``
    are padding: zero interpolation weights, position (0, 0) and a segment id of their own, so a
    padded row sees only itself and never feeds a real one.
    """

    rows: int
    active: int
    merge_unit: int
    grids: tuple[tuple[int, int, int], ...]
    interp_indices: np.ndarray  # [rows, 4] int32
    interp_weights: np.ndarray  # [rows, 4] float32
    positions: np.ndarray  # [rows, 2] int32 (h, w) for the 2D RoPE
    segments: np.ndarray  # [rows] int32: frame id, padding unique negatives
    cu_seqlens: np.ndarray  # attention bounds of the active rows (one segment per frame)

    @property
    def active_rows(self) -> list[list[int]]:
        return [[0, self.active]]

    @property
    def active_merged(self) -> int:
        return self.active // self.merge_unit

    @property
    def merged_per_image(self) -> list[int]:
        return [t * h * w // self.merge_unit for t, h, w in self.grids]

    def graph_inputs(self) -> dict[str, np.ndarray]:
        return {
            "interp_indices": self.interp_indices,
            "interp_weights": self.interp_weights,
            "positions": self.positions,
            "segments": self.segments,
        }


def pack_bucket(grid_thw, num_grid_per_side: int, rows: int | None = None, merge: int = 2) -> VisionBucket:
    """The index arrays that pack the images of ``grid_thw`` into ``rows`` patch rows (default: exactly enough)."""
    grids = tuple(_grids(grid_thw))
    unit = merge * merge
    active, rows = bucket_rows(grids, rows, unit)
    bounds = cu_seqlens(grids)
    segments = np.empty(rows, np.int32)
    segments[:active] = np.repeat(np.arange(len(bounds) - 1, dtype=np.int32), np.diff(bounds))
    segments[active:] = -1 - np.arange(rows - active, dtype=np.int32)
    indices, weights = interpolation(grids, num_grid_per_side, merge)
    interp_indices = np.zeros((rows, 4), np.int32)
    interp_weights = np.zeros((rows, 4), np.float32)
    interp_indices[:active], interp_weights[:active] = indices, weights
    positions = np.zeros((rows, 2), np.int32)
    positions[:active] = position_ids(grids, merge)
    return VisionBucket(rows, active, unit, grids, interp_indices, interp_weights, positions, segments, bounds)


def audit_bucket(bucket: VisionBucket) -> dict[str, int]:
    """Counts of attention-mask entries that must not be allowed, all zero for a correct bucket: across two
    images (frames), between real rows and padding either way, padded rows seeing anything but themselves,
    and entries blocked inside one frame. The ground truth is the bounds, not the segment ids the mask is
    built from (the emitter's mask: ``segments[:, None] == segments[None, :]``)."""
    mask = bucket.segments[:, None] == bucket.segments[None, :]
    owner = np.full(bucket.rows, -1, np.int64)
    for number, (start, stop) in enumerate(zip(bucket.cu_seqlens[:-1], bucket.cu_seqlens[1:], strict=True)):
        owner[start:stop] = number
    real = owner >= 0
    same = owner[:, None] == owner[None, :]
    padding = ~real
    return {
        "cross_image": int((mask & real[:, None] & real[None, :] & ~same).sum()),
        "real_to_padding": int((mask & real[:, None] & padding[None, :]).sum()),
        "padding_to_real": int((mask & padding[:, None] & real[None, :]).sum()),
        "padding_not_self_only": int((mask[padding] != np.eye(bucket.rows, dtype=bool)[padding]).any(axis=1).sum()),
        "blocked_within_image": int((~mask & real[:, None] & same).sum()),
    }
