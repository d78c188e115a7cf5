"""Qwen2.5-VL vision geometry: exact index math for windows, resizing, packing, masks and M-RoPE (numpy only)."""

from ...qwen_shared.mrope import mrope_positions
from .masks import MaskAudit, audit_masks, bucket_masks, segment_mask
from .packing import Bucket, pack_images
from .resize import ResizeSpec, grid_for, patchify, preprocess, smart_resize
from .windows import (
    UnreorderAudit,
    WindowLayout,
    audit_unreorder,
    cu_seqlens,
    cu_window_seqlens,
    is_involution,
    misplaced_tokens,
    position_ids,
    reverse_by_argsort,
    reverse_by_rank_scatter,
    window_index,
    window_layout,
)

__all__ = [
    "Bucket",
    "MaskAudit",
    "ResizeSpec",
    "UnreorderAudit",
    "WindowLayout",
    "audit_masks",
    "audit_unreorder",
    "bucket_masks",
    "cu_seqlens",
    "cu_window_seqlens",
    "grid_for",
    "is_involution",
    "misplaced_tokens",
    "mrope_positions",
    "pack_images",
    "patchify",
    "position_ids",
    "preprocess",
    "reverse_by_argsort",
    "reverse_by_rank_scatter",
    "segment_mask",
    "smart_resize",
    "window_index",
    "window_layout",
]
