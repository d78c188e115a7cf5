"""Images (and videos) -> Qwen2.5-VL's inputs: the checkpoint's own image processor; smart resize and
patchify under the checkpoint's preprocessor settings (numpy); what ``driftscope geometry`` prints per image size."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.errors import InputError
from driftscope.inputs.image_size import parse_size
from driftscope.inputs.processor_output import ModelInputs

from ..qwen_shared.image_processor import smart_resize as processor_resize
from ..qwen_shared.processor import run_processor
from ..qwen_shared.video import add_videos
from .geometry import audit_masks, audit_unreorder, bucket_masks, pack_images

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


# Images (and videos) -> Qwen2.5-VL's inputs: the checkpoint's own image processor (smart resize, patchify),
# its facts; a video is resized frame by frame as Qwen2-VL's video processor does and packed after the images.


def frame_resize(
    frames: int, height: int, width: int, factor: int, temporal: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's video resize: each frame's smart resize within the bounds (the frame count plays no part)."""
    return processor_resize(height, width, factor, min_pixels, max_pixels)


def prepare_inputs(
    checkpoint: Checkpoint, image_paths: list[str | Path], video_paths: list[str | Path] = ()
) -> ModelInputs:
    """Run the checkpoint's processor on the images (refusing images below its minimum pixels) and on the
    videos, packed after the images.

    The arrays are ``pixel_values`` (patches, C*T*P*P) float32 in processor order and ``grid_thw``
    (grids, 3) int64, hashed in that order for the inputs digest."""
    if video_paths and not image_paths:
        return add_videos(checkpoint, None, list(video_paths), frame_resize)
    ran = run_processor(checkpoint, image_paths)
    pixel_values, grid_thw, merge = ran.pixel_values, ran.grid_thw, ran.settings["merge_size"]
    window = int((checkpoint.config.get("vision_config") or {}).get("window_size", 112))
    inputs = ModelInputs(
        arrays={"pixel_values": pixel_values, "grid_thw": grid_thw},
        image_paths=[str(p) for p in image_paths],
        image_sizes=ran.sizes,
        image_tokens=(grid_thw.prod(axis=1) // (merge * merge)).astype(np.int64),
        facts={
            "resized": [[int(v) for v in r] for r in ran.resized],
            "grid_thw": grid_thw.tolist(),
            "patches": int(pixel_values.shape[0]),
            "processor": ran.settings,
            "window_px": window,
            "conversions": ran.conversions,
        },
        headline=f"grid {grid_thw.tolist()}, {pixel_values.shape[0]} patches",
    )
    return add_videos(checkpoint, inputs, list(video_paths), frame_resize)


# Smart resize and patchify, following the checkpoint's own preprocessor config.
#
# Settings come from ``preprocessor_config.json`` (``min_pixels``/``max_pixels`` or ``size``
# ``shortest_edge``/``longest_edge``, ``patch_size``, ``merge_size``, ``temporal_patch_size``, mean
# and std), falling back to the Qwen2.5-VL family defaults for what it does not say.

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ResizeSpec:
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    source: str = "family defaults"

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_checkpoint(cls, path: str | Path | None) -> ResizeSpec:
        """The checkpoint's processor settings; missing keys (or a missing file) take the family defaults."""
        if path is None:
            return cls()
        config_path = Path(path) / "preprocessor_config.json"
        if not config_path.exists():
            return cls()
        data = json.loads(config_path.read_text())
        size = data.get("size") or {}
        base = cls()
        return cls(
            min_pixels=int(data.get("min_pixels") or size.get("shortest_edge") or base.min_pixels),
            max_pixels=int(data.get("max_pixels") or size.get("longest_edge") or base.max_pixels),
            patch_size=int(data.get("patch_size", base.patch_size)),
            merge_size=int(data.get("merge_size", base.merge_size)),
            temporal_patch_size=int(data.get("temporal_patch_size", base.temporal_patch_size)),
            image_mean=tuple(data.get("image_mean", base.image_mean)),
            image_std=tuple(data.get("image_std", base.image_std)),
            source=str(config_path),
        )


def smart_resize(height: int, width: int, spec: ResizeSpec = ResizeSpec()) -> tuple[int, int]:
    """Both sides a multiple of patch*merge, pixels within [min, max], aspect ratio kept as well as possible."""
    factor = spec.factor
    if min(height, width) <= 0:
        raise InputError(f"image size {height}x{width} is empty", "pass an image with at least one pixel")
    if max(height, width) / min(height, width) > 200:
        raise InputError(f"image {height}x{width} has an aspect ratio above 200", "crop or pad it first")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > spec.max_pixels:
        beta = math.sqrt((height * width) / spec.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return int(h_bar), int(w_bar)


def grid_for(height: int, width: int, spec: ResizeSpec = ResizeSpec()) -> tuple[int, int, int]:
    """(t, h, w) patch grid the processor produces for an image of this size."""
    h, w = smart_resize(height, width, spec)
    return 1, h // spec.patch_size, w // spec.patch_size


def patchify(image: np.ndarray, spec: ResizeSpec = ResizeSpec()) -> np.ndarray:
    """[C, H, W] normalized image -> [patches, C*T*P*P] rows in merge-block-major order (frames repeated)."""
    image = np.asarray(image, dtype=np.float32)
    c, height, width = image.shape
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    gh, gw = height // p, width // p
    patches = image.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
    return patches.reshape(gh * gw, c * t * p * p)


def preprocess(image, spec: ResizeSpec = ResizeSpec()) -> tuple[np.ndarray, tuple[int, int, int]]:
    """A PIL image -> (pixel_values, grid_thw): bicubic resize, rescale to [0, 1], normalize, patchify."""
    from PIL import Image

    rgb = image.convert("RGB")
    height, width = smart_resize(rgb.height, rgb.width, spec)
    resized = np.asarray(rgb.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32) / 255.0
    normalized = (resized - np.asarray(spec.image_mean, np.float32)) / np.asarray(spec.image_std, np.float32)
    pixels = patchify(normalized.transpose(2, 0, 1), spec)
    return pixels, (1, height // spec.patch_size, width // spec.patch_size)


# What ``driftscope geometry`` prints: per-image window facts, and a bucket's packing and mask audit.

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
