"""Attention masks of a packed bucket and an audit that finds every way they can leak.

A mask is ``[rows, rows]`` over window-order rows: boolean (True = may attend) or additive float
(finite = may attend). The audit's ground truth is the bucket's geometry (which image and which
window each row belongs to), not the segment ids the masks were built from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .packing import Bucket


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
