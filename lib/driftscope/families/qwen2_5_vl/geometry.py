"""Qwen2.5-VL's vision geometry, exact index math in numpy: the window index, window and image bounds,
rotary positions, packing images into a bucket, and the attention masks of a bucket with their leak audit.

Everything here is integer numpy, written from the definition (not by calling transformers), so tests can hold it
against ``transformers.vision_utils`` as an independent reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..qwen_shared.grids import bucket_rows, cu_seqlens, position_ids
from ..qwen_shared.grids import grids_of as _grids
from ..qwen_shared.mrope import mrope_positions  # noqa: F401 (Qwen2.5-VL's M-RoPE positions, shared)

# Windows: the window index, window and image bounds, rotary positions.


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


# Packing several images into one fixed-size bucket of patch rows, in window order, with segments.
#
# Rows ``[0, active)`` hold the images one after another, each in its own window order (exactly the
# layout the reference runs in); rows ``[active, rows)`` are padding. Segment ids drive the masks:
# a row attends to rows with the same id; every padded row has an id of its own, so it sees only
# itself and never feeds an active row.


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


# Attention masks of a packed bucket and an audit that finds every way they can leak.
#
# A mask is ``[rows, rows]`` over window-order rows: boolean (True = may attend) or additive float
# (finite = may attend). The audit's ground truth is the bucket's geometry (which image and which
# window each row belongs to), not the segment ids the masks were built from.


def segment_mask(segments: np.ndarray) -> np.ndarray:
    """True where query and key share a segment id (the emitter builds its masks the same way)."""
    segments = np.asarray(segments)
    return segments[:, None] == segments[None, :]


def bucket_masks(bucket: Bucket) -> tuple[np.ndarray, np.ndarray]:
    """(full-attention mask, window-attention mask) of a bucket."""
    return segment_mask(bucket.image_segments), segment_mask(bucket.window_segments)


def row_owners(bucket: Bucket) -> tuple[np.ndarray, np.ndarray]:
    """(image id, window id) of every window-order row; -1 for padding. From the bounds, not the segments."""
    media = np.full(bucket.rows, -1, dtype=np.int64)
    window = np.full(bucket.rows, -1, dtype=np.int64)
    for number, (start, stop) in enumerate(zip(bucket.cu_seqlens[:-1], bucket.cu_seqlens[1:], strict=True)):
        media[start:stop] = number
    for number, (start, stop) in enumerate(
        zip(bucket.cu_window_seqlens[:-1], bucket.cu_window_seqlens[1:], strict=True)
    ):
        window[start:stop] = number
    return media, window


@dataclass(frozen=True)
class MaskAudit:
    """Counts of allowed (finite) entries that must not be, per mask; all zero for correct masks."""

    cross_media: dict
    active_to_padding: dict
    padding_to_active: dict
    padding_not_self_only: dict  # padded query rows that see anything but themselves (or nothing)
    window_cross_window: int  # window mask entries across two windows of one image
    full_blocked_within_media: int  # full mask entries blocked inside one image
    window_must_differ: bool  # some image has more than one window
    window_differs_from_full: bool

    @property
    def leaks(self) -> int:
        counts = [
            *self.cross_media.values(),
            *self.active_to_padding.values(),
            *self.padding_to_active.values(),
            *self.padding_not_self_only.values(),
            self.window_cross_window,
            self.full_blocked_within_media,
        ]
        missing = int(self.window_must_differ and not self.window_differs_from_full)
        return int(sum(counts)) + missing

    @property
    def ok(self) -> bool:
        return self.leaks == 0

    def to_dict(self) -> dict:
        return {**asdict(self), "leaks": self.leaks, "ok": self.ok}

    def rows(self) -> list[dict]:
        """One row per check, for a table."""
        out = []
        for name in ("cross_media", "active_to_padding", "padding_to_active", "padding_not_self_only"):
            for mask, count in getattr(self, name).items():
                out.append({"check": name, "mask": mask, "count": int(count)})
        out.append({"check": "window_cross_window", "mask": "window", "count": self.window_cross_window})
        out.append({"check": "full_blocked_within_media", "mask": "full", "count": self.full_blocked_within_media})
        out.append(
            {
                "check": "window_differs_from_full (required)",
                "mask": "both",
                "count": int(self.window_must_differ and not self.window_differs_from_full),
            }
        )
        return out


def allowed(mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    return mask.astype(bool) if mask.dtype == np.bool_ else np.isfinite(mask)


def audit_masks(full: np.ndarray, window: np.ndarray, bucket: Bucket) -> MaskAudit:
    """Audit two masks of ``bucket`` against its geometry."""
    media, owner_window = row_owners(bucket)
    active = media >= 0
    masks = {"full": allowed(full), "window": allowed(window)}
    both_active = active[:, None] & active[None, :]
    other_media = both_active & (media[:, None] != media[None, :])
    a_to_p = active[:, None] & ~active[None, :]
    p_to_a = ~active[:, None] & active[None, :]
    eye = np.eye(bucket.rows, dtype=bool)
    same_media = both_active & (media[:, None] == media[None, :])
    cross_window = same_media & (owner_window[:, None] != owner_window[None, :])
    padded = ~active

    def count(selector, name):
        return int((masks[name] & selector).sum())

    def not_self_only(name):
        rows = masks[name][padded]
        return int((rows != eye[padded]).any(axis=1).sum())

    windows_per_media = [len(set(owner_window[media == m].tolist())) for m in range(int(media.max()) + 1)]
    return MaskAudit(
        cross_media={name: count(other_media, name) for name in masks},
        active_to_padding={name: count(a_to_p, name) for name in masks},
        padding_to_active={name: count(p_to_a, name) for name in masks},
        padding_not_self_only={name: not_self_only(name) for name in masks},
        window_cross_window=count(cross_window, "window"),
        full_blocked_within_media=int((same_media & ~masks["full"]).sum()),
        window_must_differ=any(n > 1 for n in windows_per_media),
        window_differs_from_full=bool((masks["full"] != masks["window"])[both_active].any()),
    )
