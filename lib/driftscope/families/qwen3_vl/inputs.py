"""Images (and videos, packed after them) -> Qwen3-VL's inputs: the checkpoint's own image processor (smart
resize, patchify) and the processor contract: the resize bounds and the resampler it ran with, against what the
checkpoint's preprocessor_config.json states (a difference is a warning of the run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs

from ..qwen_shared.processor import (
    contract_differences,
    contract_settings,
    load_image_processor,
    run_processor,
    stated_settings,
)
from ..qwen_shared.video import add_videos
from .plan import vision_config

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


def video_resize(
    frames: int, height: int, width: int, factor: int, temporal: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen3-VL's video resize: the bounds hold the pixels of all frames together (transformers' own rule)."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    return smart_resize(frames, height, width, temporal, factor, min_pixels, max_pixels)


def prepare_inputs(
    checkpoint: Checkpoint,
    image_paths: list[str | Path],
    overrides: dict[str, Any] | None = None,
    video_paths: list[str | Path] = (),
) -> ModelInputs:
    """Run the checkpoint's processor (``overrides`` replace settings of its preprocessor_config.json) on the
    images. An image below the minimum pixels is upscaled, as Qwen3-VL's processor does by design (224x224
    becomes 256x256), and the facts say so.

    The arrays are ``pixel_values`` (patches, C*T*P*P) float32 in processor order and ``grid_thw``
    (images, 3) int64, hashed in that order for the inputs digest."""
    processor = load_image_processor(checkpoint, **(overrides or {}))
    if video_paths and not image_paths:
        return add_videos(checkpoint, None, list(video_paths), video_resize, processor, refuse_upscale=False)
    ran = run_processor(checkpoint, image_paths, processor, refuse_upscale=False)
    settings = contract_settings(processor)
    stated = stated_settings(checkpoint.path)
    differences = contract_differences(settings, stated)
    pixel_values, grid_thw, merge = ran.pixel_values, ran.grid_thw, settings["merge_size"]
    upscaled = [
        f"{h}x{w} -> {rh}x{rw}"
        for (h, w), (rh, rw) in zip(ran.sizes, ran.resized, strict=True)
        if rh * rw > h * w and h * w < settings["min_pixels"]
    ]
    side = int(round(int(vision_config(checkpoint.config).get("num_position_embeddings", 2304)) ** 0.5))
    inputs = ModelInputs(
        arrays={"pixel_values": pixel_values, "grid_thw": grid_thw},
        image_paths=[str(p) for p in image_paths],
        image_sizes=ran.sizes,
        image_tokens=(grid_thw.prod(axis=1) // (merge * merge)).astype(np.int64),
        facts={
            "resized": [[int(v) for v in r] for r in ran.resized],
            "grid_thw": grid_thw.tolist(),
            "patches": int(pixel_values.shape[0]),
            "processor": settings,
            "processor_contract": {
                "stated": {key: value for key, value in stated.items() if key != "conflicts"},
                "differences": differences,
                "upscaled_by_min_pixels": upscaled,
            },
            "position_table": f"{side}x{side}",
            "conversions": ran.conversions,
        },
        headline=f"grid {grid_thw.tolist()}, {pixel_values.shape[0]} patches"
        + (f", upscaled by min_pixels ({'; '.join(upscaled)})" if upscaled else ""),
        warnings=[f"processor contract: {difference}" for difference in differences],
    )
    return add_videos(checkpoint, inputs, list(video_paths), video_resize, processor, refuse_upscale=False)
