"""Images -> Qwen2.5-VL's inputs: the checkpoint's own image processor (smart resize, patchify), its facts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.inputs.processor_output import ModelInputs

from ..qwen_shared.processor import run_processor

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


def prepare_inputs(checkpoint: Checkpoint, image_paths: list[str | Path]) -> ModelInputs:
    """Run the checkpoint's processor on the images; refuse images below its minimum pixels.

    The arrays are ``pixel_values`` (patches, C*T*P*P) float32 in processor order and ``grid_thw``
    (images, 3) int64, hashed in that order for the inputs digest."""
    ran = run_processor(checkpoint, image_paths)
    pixel_values, grid_thw, merge = ran.pixel_values, ran.grid_thw, ran.settings["merge_size"]
    window = int((checkpoint.config.get("vision_config") or {}).get("window_size", 112))
    return ModelInputs(
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
