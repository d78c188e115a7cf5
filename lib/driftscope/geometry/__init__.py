"""Vision geometry: exact index math for windows, positions and packing (numpy only)."""

from .packing import Bucket, pack_images
from .windows import (
    WindowLayout,
    cu_seqlens,
    cu_window_seqlens,
    position_ids,
    reverse_by_argsort,
    reverse_by_rank_scatter,
    window_index,
    window_layout,
)

__all__ = [
    "Bucket",
    "WindowLayout",
    "cu_seqlens",
    "cu_window_seqlens",
    "pack_images",
    "position_ids",
    "reverse_by_argsort",
    "reverse_by_rank_scatter",
    "window_index",
    "window_layout",
]
