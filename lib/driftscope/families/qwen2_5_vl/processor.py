"""Images (and videos) -> Qwen2.5-VL's inputs: the checkpoint's own image processor (smart resize, patchify),
its facts; a video is resized frame by frame as Qwen2-VL's video processor does and packed after the images."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.inputs.processor_output import ModelInputs

from ..qwen_shared.image_processor import smart_resize
from ..qwen_shared.processor import run_processor
from ..qwen_shared.video import add_videos

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


def frame_resize(
    frames: int, height: int, width: int, factor: int, temporal: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's video resize: each frame's smart resize within the bounds (the frame count plays no part)."""
    return smart_resize(height, width, factor, min_pixels, max_pixels)


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
