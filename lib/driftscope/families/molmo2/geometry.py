"""Molmo2's crop and pooling geometry: which crops an image becomes and which patches each token pools.

An image becomes one low-resolution crop (the whole image resized to 378 x 378) followed by
``rows x cols`` overlapping high-resolution crops of 378 px. Neighbouring crops overlap by
``2 * margin`` patches; each patch of the high-resolution canvas is read from exactly one crop (the
interior margins of a crop are marked -1 there). Tokens pool 2 x 2 patches; a grid that does not
divide evenly is padded with -1 on both sides (the odd extra row or column after). The low-resolution
crop's tokens come first; high-resolution indices are offset by the 729 patches of that crop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError


@dataclass(frozen=True)
class CropSpec:
    """The image processor's settings (``preprocessor_config.json``), with the hub's defaults."""

    crop_size: int = 378
    patch_size: int = 14
    margins: tuple[int, int] = (4, 4)
    max_crops: int = 8
    pooling: tuple[int, int] = (2, 2)  # (h, w)
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    resample: int = 2  # PIL's BILINEAR

    @property
    def crop_patches(self) -> int:
        return self.crop_size // self.patch_size

    @property
    def patches_per_crop(self) -> int:
        return self.crop_patches**2

    @property
    def window_patches(self) -> int:
        """Patches of a crop that no neighbour shares: the crop minus both margins."""
        return self.crop_patches - sum(self.margins)

    @classmethod
    def from_checkpoint(cls, path: str | Path | None) -> CropSpec:
        if path is None or not (Path(path) / "preprocessor_config.json").exists():
            return cls()
        data = json.loads((Path(path) / "preprocessor_config.json").read_text())
        size = data.get("size") or {}
        if size and size.get("height") != size.get("width"):
            raise InputError(
                f"Molmo2 crops must be square, the preprocessor config says {size}",
                "set size.height == size.width in preprocessor_config.json",
            )
        base = cls()
        return cls(
            crop_size=int(size.get("height", base.crop_size)),
            patch_size=int(data.get("patch_size", base.patch_size)),
            margins=tuple(int(m) for m in data.get("overlap_margins", base.margins)),
            max_crops=int(data.get("max_crops", base.max_crops)),
            pooling=tuple(int(p) for p in data.get("pooling_size", base.pooling)),
            image_mean=tuple(float(v) for v in data.get("image_mean", base.image_mean)),
            image_std=tuple(float(v) for v in data.get("image_std", base.image_std)),
            resample=int(data.get("resample", base.resample)),
        )


def select_tiling(height: int, width: int, window: int, max_crops: int) -> tuple[int, int]:
    """(rows, cols) of crop windows: the smallest upscale that covers the image, else the least downscale.

    Candidates are ordered by crop count, then rows; ``height``/``width`` are the image minus the
    margins and may be zero or negative for tiny images (then the largest candidate scale wins).
    """
    candidates = sorted(
        ((r, c) for r in range(1, max_crops + 1) for c in range(1, max_crops + 1) if r * c <= max_crops),
        key=lambda rc: (rc[0] * rc[1], rc[0]),
    )
    size = np.array([height, width], dtype=np.float32)
    with np.errstate(divide="ignore"):
        scales = (np.array(candidates, dtype=np.float32) * window / size).min(axis=-1)
    if np.all(scales < 1):
        return candidates[int(np.argmax(scales))]
    return candidates[int(np.argmin(np.where(scales < 1.0, 1e9, scales)))]


@dataclass(frozen=True)
class CropLayout:
    """Where one image's crops come from and how its tokens pool them."""

    image_size: tuple[int, int]  # (height, width) of the input image
    tiling: tuple[int, int]  # (rows, cols) of high-resolution crops
    resized: tuple[int, int]  # (height, width) the image is resized to before cropping
    pooling: np.ndarray  # [tokens, pool_h * pool_w] int, -1 for padding slots; low-res tokens first
    grid: tuple[int, int, int, int]  # (low-res token rows, cols, high-res token rows, cols)

    @property
    def crops(self) -> int:
        return 1 + self.tiling[0] * self.tiling[1]

    @property
    def tokens(self) -> int:
        return int(self.pooling.shape[0])

    @property
    def valid_counts(self) -> np.ndarray:
        """Valid patches per pooled token (the pooler's query denominator)."""
        return (self.pooling >= 0).sum(axis=-1).astype(np.int32)


def pool_windows(index: np.ndarray, pool_h: int, pool_w: int) -> np.ndarray:
    """[H, W] patch indices -> [tokens, pool_h * pool_w], padding the grid with -1 centred (extra after)."""
    h, w = index.shape
    pad_h, pad_w = -h % pool_h, -w % pool_w
    padded = np.pad(index, [(pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2)], constant_values=-1)
    rows, cols = padded.shape[0] // pool_h, padded.shape[1] // pool_w
    windows = padded.reshape(rows, pool_h, cols, pool_w).transpose(0, 2, 1, 3)
    return windows.reshape(rows * cols, pool_h * pool_w)


def canvas_index(tiling: tuple[int, int], spec: CropSpec) -> np.ndarray:
    """Patch index (crop * 729 + row * 27 + col) of every patch of the high-resolution canvas.

    Canvas row ``y`` is read from crop row ``clip((y - margin) // window, 0, rows - 1)``: the crop
    whose kept part (without its interior margins) holds it.
    """
    n, window, margin = spec.crop_patches, spec.window_patches, spec.margins[0]
    axes = []
    for count in tiling:
        position = np.arange(count * window + sum(spec.margins))
        crop = np.clip((position - margin) // window, 0, count - 1)
        axes.append((crop, position - crop * window))
    (crop_y, local_y), (crop_x, local_x) = axes
    crop = crop_y[:, None] * tiling[1] + crop_x[None, :]
    return (crop * n * n + local_y[:, None] * n + local_x[None, :]).astype(np.int64)


def crop_layout(height: int, width: int, spec: CropSpec = CropSpec()) -> CropLayout:
    """The crops and pooling indices of a ``height`` x ``width`` image."""
    if height < 1 or width < 1:
        raise InputError(f"image size {height}x{width} is empty", "pass an image with at least one pixel")
    margin_px = spec.patch_size * sum(spec.margins)
    window_px = spec.window_patches * spec.patch_size
    tiling = select_tiling(height - margin_px, width - margin_px, window_px, spec.max_crops)
    resized = (tiling[0] * window_px + margin_px, tiling[1] * window_px + margin_px)
    pool_h, pool_w = spec.pooling
    n = spec.crop_patches
    low = pool_windows(np.arange(n * n).reshape(n, n), pool_h, pool_w)
    high = pool_windows(canvas_index(tiling, spec), pool_h, pool_w)
    high = np.where(high >= 0, high + spec.patches_per_crop, -1)  # the low-resolution crop comes first
    low_rows, low_cols = -(-n // pool_h), -(-n // pool_w)
    canvas = canvas_index(tiling, spec).shape
    grid = (low_rows, low_cols, -(-canvas[0] // pool_h), -(-canvas[1] // pool_w))
    return CropLayout((height, width), tiling, resized, np.concatenate([low, high]), grid)


def crop_boxes(layout: CropLayout, spec: CropSpec = CropSpec()) -> list[dict]:
    """Each high-resolution crop's box on the resized canvas and the part of it no neighbour reads, in pixels
    (x0, y0, x1, y1); the low-resolution crop is the whole image."""
    size, step, margin = spec.crop_size, spec.window_patches * spec.patch_size, spec.margins[0] * spec.patch_size
    rows, cols = layout.tiling
    boxes = []
    for r in range(rows):
        for c in range(cols):
            x0, y0 = c * step, r * step
            keep = [x0 + (margin if c else 0), y0 + (margin if r else 0)]
            keep += [x0 + size - (margin if c < cols - 1 else 0), y0 + size - (margin if r < rows - 1 else 0)]
            boxes.append({"crop": 1 + r * cols + c, "box": [x0, y0, x0 + size, y0 + size], "kept": keep})
    return boxes


def summary(height: int, width: int, spec: CropSpec = CropSpec()) -> dict:
    """What ``driftscope geometry`` shows for one image size: crops, tokens and partially padded windows."""
    layout = crop_layout(height, width, spec)
    low = layout.grid[0] * layout.grid[1]
    counts, slots = layout.valid_counts, spec.pooling[0] * spec.pooling[1]
    return {
        "image": f"{height}x{width}",
        "tiling": list(layout.tiling),
        "crops": layout.crops,
        "canvas": f"{layout.resized[0]}x{layout.resized[1]}",
        "low_res_tokens": int(low),
        "high_res_tokens": int(layout.tokens - low),
        "tokens": layout.tokens,
        "padded_low_res": int((counts[:low] < slots).sum()),
        "padded_high_res": int((counts[low:] < slots).sum()),
        "valid_slots": {str(n): int((counts == n).sum()) for n in range(1, slots + 1)},
    }
