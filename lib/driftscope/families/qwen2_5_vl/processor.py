"""Images -> Qwen2.5-VL's inputs: the checkpoint's own image processor (smart resize, patchify), its facts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import InputError
from ...inputs import ModelInputs, as_processor_sees, load_image

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint


def load_image_processor(checkpoint: Checkpoint):
    """The checkpoint's own image processor, built from transformers' PIL class (no torchvision)."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(str(checkpoint.path), backend="pil")
    except TypeError:
        return AutoImageProcessor.from_pretrained(str(checkpoint.path))
    except OSError as err:
        raise InputError(
            f"checkpoint {checkpoint.path} has no usable preprocessor_config.json ({err})",
            "save the image processor next to the weights (processor.save_pretrained)",
        ) from err


def processor_settings(processor) -> dict:
    size = getattr(processor, "size", None) or {}
    size = dict(size) if not isinstance(size, dict) else size
    return {
        "class": type(processor).__name__,
        "min_pixels": int(size.get("shortest_edge") or getattr(processor, "min_pixels", 56 * 56)),
        "max_pixels": int(size.get("longest_edge") or getattr(processor, "max_pixels", 28 * 28 * 1280)),
        "patch_size": int(getattr(processor, "patch_size", 14)),
        "merge_size": int(getattr(processor, "merge_size", 2)),
        "temporal_patch_size": int(getattr(processor, "temporal_patch_size", 2)),
    }


def prepare_inputs(checkpoint: Checkpoint, image_paths: list[str | Path]) -> ModelInputs:
    """Run the checkpoint's processor on the images; refuse images below its minimum pixels.

    The arrays are ``pixel_values`` (patches, C*T*P*P) float32 in processor order and ``grid_thw``
    (images, 3) int64, hashed in that order for the inputs digest."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    if not image_paths:
        raise InputError("no images given", "list at least one image under 'images'")
    processor = load_image_processor(checkpoint)
    settings = processor_settings(processor)
    images, sizes, resized, conversions = [], [], [], []
    factor = settings["patch_size"] * settings["merge_size"]
    for path in image_paths:
        image, conversion = as_processor_sees(load_image(path), processor, path)
        conversions.append(conversion)
        width, height = image.size
        if width * height < settings["min_pixels"]:
            side = int(np.ceil(np.sqrt(settings["min_pixels"])))
            raise InputError(
                f"image {path} is {height}x{width} = {width * height} pixels, below the processor's "
                f"min_pixels {settings['min_pixels']}; the processor would upscale it and the run would "
                "not test the image you gave",
                f"use an image of at least {side}x{side} pixels, or lower min_pixels in the checkpoint's "
                "preprocessor_config.json",
            )
        try:
            resized.append(smart_resize(height, width, factor, settings["min_pixels"], settings["max_pixels"]))
        except ValueError as err:
            raise InputError(
                f"image {path} ({height}x{width}) cannot be resized: {err}", "use a less extreme aspect ratio"
            ) from err
        images.append(image)
        sizes.append((height, width))
    out = processor(images=images, return_tensors="np")
    pixel_values = np.asarray(out["pixel_values"], dtype=np.float32)
    grid_thw = np.asarray(out["image_grid_thw"], dtype=np.int64)
    merge = settings["merge_size"]
    window = int((checkpoint.config.get("vision_config") or {}).get("window_size", 112))
    return ModelInputs(
        arrays={"pixel_values": pixel_values, "grid_thw": grid_thw},
        image_paths=[str(p) for p in image_paths],
        image_sizes=sizes,
        image_tokens=(grid_thw.prod(axis=1) // (merge * merge)).astype(np.int64),
        facts={
            "resized": [[int(v) for v in r] for r in resized],
            "grid_thw": grid_thw.tolist(),
            "patches": int(pixel_values.shape[0]),
            "processor": settings,
            "window_px": window,
            "conversions": conversions,
        },
        headline=f"grid {grid_thw.tolist()}, {pixel_values.shape[0]} patches",
    )
