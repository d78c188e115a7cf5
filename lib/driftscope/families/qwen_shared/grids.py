"""Image grids (t, h, w in patches) as the Qwen processors lay them out: patch coordinates in processor
order (2x2 merge blocks one after another, each block row-major) and full-attention bounds per frame.

Integer numpy written from the definition, held against ``transformers.vision_utils`` by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import InputError

Grid = Sequence[int]  # (t, h, w) in patches


def grids_of(grid_thw: Sequence[Grid] | np.ndarray) -> list[tuple[int, int, int]]:
    """The grids as (t, h, w) integer tuples, one per image."""
    return [(int(t), int(h), int(w)) for t, h, w in np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)]


def cu_seqlens(grid_thw) -> np.ndarray:
    """Full-attention bounds in patches: one segment per frame of every image."""
    lengths = [h * w for t, h, w in grids_of(grid_thw) for _ in range(t)]
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def one_segment(grid_thw, pixel_values: np.ndarray) -> str | None:
    """Why attention leaking across the packed images and the frames of a video cannot show (None: it can):
    fewer than two attention segments (frames of every grid), or segments whose pixels are all identical."""
    bounds = cu_seqlens(grid_thw)
    if len(bounds) < 3:
        return (
            "one image of one frame: there is nothing to leak across (pack two or more images, or a video of two "
            "or more temporal patches, in the bucket)"
        )
    segments = [pixel_values[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if all(seg.shape == segments[0].shape and np.array_equal(seg, segments[0]) for seg in segments[1:]):
        return "the packed images and frames are identical: attending across copies of the same tokens changes nothing"
    return None


def position_ids(grid_thw, spatial_merge_size: int = 2) -> np.ndarray:
    """(h, w) patch coordinates per processor row (rows are merge-block-major), shape [patches, 2]."""
    rows = []
    m = spatial_merge_size
    for t, h, w in grids_of(grid_thw):
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // m, m, w // m, m)
        hpos = hh.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        wpos = ww.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        rows.append(np.tile(np.stack([hpos, wpos], axis=-1), (t, 1)))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 2), dtype=np.int64)


def bucket_rows(grids: Sequence[Grid], rows: int | None, unit: int) -> tuple[int, int]:
    """(the images' patch rows, the bucket's rows: ``rows``, default exactly enough) for packing ``grids``; a
    bucket too small for them or not a multiple of the merge ``unit`` is refused."""
    active = sum(t * h * w for t, h, w in grids)
    rows = active if rows is None else int(rows)
    if rows < active:
        sizes = ", ".join(f"{t}x{h}x{w}={t * h * w}" for t, h, w in grids)
        raise InputError(
            f"bucket of {rows} rows is too small: the images need {active} patch rows ({sizes})",
            f"use a bucket of at least {active} rows (a multiple of {unit}), or fewer/smaller images",
        )
    if rows % unit:
        raise InputError(
            f"bucket rows {rows} is not a multiple of the merge unit {unit}", f"use {rows + unit - rows % unit}"
        )
    return active, rows
