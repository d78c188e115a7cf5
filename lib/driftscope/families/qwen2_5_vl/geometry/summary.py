"""What ``driftscope geometry`` prints: per-image window facts, and a bucket's packing and mask audit."""

from __future__ import annotations

from ....inputs.image_size import parse_size
from .masks import audit_masks, bucket_masks
from .packing import pack_images
from .resize import ResizeSpec, grid_for
from .windows import audit_unreorder

WINDOW_SIZE = 112


def image_rows(sizes: list[str], spec: ResizeSpec, window_size: int = WINDOW_SIZE) -> list[dict]:
    rows = []
    for text in sizes:
        height, width = parse_size(text)
        grid = grid_for(height, width, spec)
        audit = audit_unreorder([grid], spec.merge_size, window_size, spec.patch_size)
        rows.append(
            {
                "image": f"{height}x{width}",
                "resized": f"{grid[1] * spec.patch_size}x{grid[2] * spec.patch_size}",
                "grid_thw": list(grid),
                "patches": grid[0] * grid[1] * grid[2],
                "merged_tokens": audit.merged_tokens,
                "windows": audit.windows,
                "padded_windows": audit.partial_windows,
                "involution": audit.involution,
                "identity_permutation": audit.identity,
                "misplaced_by_rank_scatter": audit.misplaced_by_rank_scatter,
            }
        )
    return rows


def bucket_summary(sizes: list[str], rows: int | None, spec: ResizeSpec, window_size: int = WINDOW_SIZE) -> dict:
    grids = [grid_for(*parse_size(text), spec) for text in sizes]
    bucket = pack_images(grids, rows, spec.merge_size, window_size, spec.patch_size)
    full, window = bucket_masks(bucket)
    audit = audit_masks(full, window, bucket)
    starts = bucket.cu_seqlens.tolist()
    return {
        "rows": bucket.rows,
        "active": bucket.active,
        "padding": bucket.rows - bucket.active,
        "media": [{"image": text, "rows": [starts[i], starts[i + 1]]} for i, text in enumerate(sizes)],
        "windows": int(len(bucket.cu_window_seqlens) - 1),
        "audit": audit.to_dict(),
    }


def format_text(images: list[dict], bucket: dict | None) -> str:
    columns = [
        "image",
        "resized",
        "grid_thw",
        "patches",
        "merged_tokens",
        "windows",
        "padded_windows",
        "involution",
        "misplaced_by_rank_scatter",
    ]
    table = [columns] + [[str(row[c]) for c in columns] for row in images]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in table]
    if bucket:
        lines += [
            "",
            f"bucket: {bucket['rows']} rows, {bucket['active']} active, {bucket['padding']} padding, "
            f"{bucket['windows']} windows",
        ]
        lines += [f"  {m['image']}: rows {m['rows'][0]}..{m['rows'][1]}" for m in bucket["media"]]
        audit = bucket["audit"]
        lines.append(f"mask audit: {'ok' if audit['ok'] else 'LEAKS'} ({audit['leaks']} leaking entries)")
        for key in ("cross_media", "active_to_padding", "padding_to_active", "padding_not_self_only"):
            lines.append(f"  {key}: " + ", ".join(f"{mask} {count}" for mask, count in audit[key].items()))
        lines.append(
            f"  window_cross_window: {audit['window_cross_window']}; "
            f"full_blocked_within_media: {audit['full_blocked_within_media']}; "
            f"window differs from full: {audit['window_differs_from_full']} "
            f"(required: {audit['window_must_differ']})"
        )
    return "\n".join(lines)
