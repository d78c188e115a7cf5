"""Qwen2-VL's image processor in NumPy and PIL: transformers' ``Qwen2VLImageProcessorPil`` step for step (the
settings of the checkpoint's preprocessor_config.json over the class defaults, smart resize, PIL's resampler,
rescale in float64 then float32, normalize, patchify), without importing transformers or torch.

Preparing a run's inputs is what a cold run does before its first capture; transformers' class imports torch and
``transformers.modeling_utils`` on the way (seconds on a 2-core machine). tests/families/test_qwen_image_processor.py
holds this one equal to transformers' output, bit for bit, on every Qwen family's checkpoints and on images of
every PIL mode and shape. A config this module does not know in full (another processor class, a setting it does
not implement) is left to transformers' own class (:func:`numpy_image_processor` returns None).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

#: the image processor classes this module reproduces (their PIL backend: ``image_processor_type`` names the fast
#: one in Qwen3-VL's releases; both compute the same with the PIL backend ``load_image_processor`` asks for)
CLASSES = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: ``Qwen2VLImageProcessorPil``'s class defaults (transformers 5.24)
DEFAULTS = {
    "do_resize": True,
    "resample": 3,  # PIL bicubic
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": OPENAI_CLIP_MEAN,
    "image_std": OPENAI_CLIP_STD,
    "do_convert_rgb": True,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
#: keys of a preprocessor_config.json that name things rather than change the computation
INERT = ("image_processor_type", "processor_class", "auto_map", "_processor_class", "video_processor_type")


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
) -> tuple[int, int]:
    """transformers' ``qwen2_vl`` smart resize: both sides divisible by ``factor``, the pixels within the bounds,
    the aspect ratio kept as closely as possible; ValueError past an aspect ratio of 200."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize_chw(image: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """A ``[channels, h, w]`` uint8 image resized by PIL with ``resample`` (transformers' ``image_transforms.resize``
    of a uint8 image: through a PIL image and back)."""
    from PIL import Image

    pil = Image.fromarray(np.ascontiguousarray(np.moveaxis(image, 0, -1)).astype(np.uint8))
    return np.moveaxis(np.array(pil.resize((width, height), resample=resample)), -1, 0)


def rescale(image: np.ndarray, scale: float) -> np.ndarray:
    """transformers' ``rescale``: multiplied in float64, then float32."""
    return (image.astype(np.float64) * scale).astype(np.float32)


def normalize(image: np.ndarray, mean, std) -> np.ndarray:
    """transformers' ``normalize`` of a channels-first image, in the image's float dtype (float32 for integers)."""
    image = image if np.issubdtype(image.dtype, np.floating) else image.astype(np.float32)
    mean, std = np.array(mean, dtype=image.dtype), np.array(std, dtype=image.dtype)
    return ((image.T - mean) / std).T


class QwenImageProcessor:
    """The processor's settings (the attributes transformers' class holds) and its call on RGB PIL images."""

    #: what the run's facts say ran (``processor.processor_settings``' ``class``)
    name = "Qwen2VLImageProcessorPil (NumPy)"

    def __init__(self, **settings: Any):
        merged = {**DEFAULTS, **settings}
        size = dict(merged.pop("size") or DEFAULTS["size"])
        if merged.get("min_pixels") is not None:
            size["shortest_edge"] = int(merged["min_pixels"])
        if merged.get("max_pixels") is not None:
            size["longest_edge"] = int(merged["max_pixels"])
        self.size = size
        self.min_pixels, self.max_pixels = int(size["shortest_edge"]), int(size["longest_edge"])
        self.do_resize, self.do_rescale = bool(merged["do_resize"]), bool(merged["do_rescale"])
        self.do_normalize, self.do_convert_rgb = bool(merged["do_normalize"]), bool(merged["do_convert_rgb"])
        self.resample, self.rescale_factor = int(merged["resample"]), float(merged["rescale_factor"])
        self.image_mean, self.image_std = list(merged["image_mean"]), list(merged["image_std"])
        self.patch_size, self.merge_size = int(merged["patch_size"]), int(merged["merge_size"])
        self.temporal_patch_size = int(merged["temporal_patch_size"])

    def resize_array(self, image: np.ndarray, height: int, width: int) -> np.ndarray:
        return resize_chw(image, height, width, self.resample)

    def rescale(self, image: np.ndarray, scale: float) -> np.ndarray:
        return rescale(image, scale)

    def normalize(self, image: np.ndarray, mean, std) -> np.ndarray:
        return normalize(image, mean, std)

    def patchify(self, image: np.ndarray) -> tuple[np.ndarray, int, int]:
        """transformers' patchify: ``[patches, channels * temporal * patch * patch]`` in the merge order."""
        image = np.asarray(image, dtype=np.float32)
        channel, height, width = image.shape
        patch, merge, temporal = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // patch, width // patch
        patches = image.reshape(channel, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        patches = np.transpose(patches, (1, 4, 2, 5, 0, 3, 6))
        patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], temporal, *patches.shape[5:]))
        return patches.reshape(grid_h * grid_w, channel * temporal * patch * patch), grid_h, grid_w

    def __call__(self, images: list, return_tensors: str = "np") -> dict[str, np.ndarray]:
        """``pixel_values`` ``[patches, C*T*P*P]`` float32 and ``image_grid_thw`` ``[images, 3]`` of RGB images."""
        all_patches, grids = [], []
        factor = self.patch_size * self.merge_size
        for image in images:
            array = np.moveaxis(np.asarray(image), -1, 0)  # what transformers makes of a PIL image: [C, H, W]
            if self.do_resize:
                height, width = smart_resize(array.shape[1], array.shape[2], factor, self.min_pixels, self.max_pixels)
                array = self.resize_array(array, height, width)
            if self.do_rescale:
                array = self.rescale(array, self.rescale_factor)
            if self.do_normalize:
                array = self.normalize(array, self.image_mean, self.image_std)
            patches, grid_h, grid_w = self.patchify(array)
            all_patches.append(patches)
            grids.append([1, grid_h, grid_w])
        return {"pixel_values": np.concatenate(all_patches, axis=0), "image_grid_thw": np.array(grids, dtype=np.int64)}


def numpy_image_processor(path: str | Path, **overrides: Any) -> QwenImageProcessor | None:
    """The checkpoint's Qwen2-VL image processor in NumPy, or None where its preprocessor_config.json names
    another class or a setting this module does not implement (transformers' own class then runs)."""
    try:
        data = json.loads((Path(path) / "preprocessor_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("image_processor_type") not in CLASSES:
        return None
    settings = {key: value for key, value in {**data, **overrides}.items() if key not in INERT}
    if set(settings) - set(DEFAULTS) - {"min_pixels", "max_pixels"}:
        return None
    try:
        return QwenImageProcessor(**settings)
    except (TypeError, ValueError, KeyError):
        return None
