"""Smart resize and patchify, following the checkpoint's own preprocessor config.

Settings come from ``preprocessor_config.json`` (``min_pixels``/``max_pixels`` or ``size``
``shortest_edge``/``longest_edge``, ``patch_size``, ``merge_size``, ``temporal_patch_size``, mean
and std), falling back to the Qwen2.5-VL family defaults for what it does not say.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....errors import InputError

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
