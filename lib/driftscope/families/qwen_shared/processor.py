"""The checkpoint's own Qwen2-VL-style image processor (transformers' PIL class, no torchvision; in NumPy where
``image_processor`` reproduces it), run once on the images, and the settings it ran with (the processor contract:
resize bounds, resampler, patching)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from driftscope.inputs.processor_output import as_processor_sees, load_image

from ...errors import InputError
from .image_processor import numpy_image_processor, smart_resize

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


def load_image_processor(checkpoint: Checkpoint, **overrides: Any):
    """The checkpoint's own image processor: transformers' PIL class (no torchvision) in NumPy where this package
    reproduces it (``image_processor``: no torch imported), else transformers' own; ``overrides`` replace settings
    of its preprocessor_config.json (e.g. ``resample``)."""
    found = numpy_image_processor(checkpoint.path, **overrides)
    if found is not None:
        return found
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(str(checkpoint.path), backend="pil", **overrides)
    except TypeError:
        return AutoImageProcessor.from_pretrained(str(checkpoint.path), **overrides)
    except OSError as err:
        raise InputError(
            f"checkpoint {checkpoint.path} has no usable preprocessor_config.json ({err})",
            "save the image processor next to the weights (processor.save_pretrained)",
        ) from err


def resampler_name(value: Any) -> str:
    """PIL's name of a resampling filter (3 -> ``bicubic``)."""
    from PIL import Image

    try:
        return Image.Resampling(int(value)).name.lower()
    except (TypeError, ValueError):
        return str(value)


def processor_settings(processor) -> dict:
    """Resize bounds and patching of a loaded processor."""
    size = getattr(processor, "size", None) or {}
    size = dict(size) if not isinstance(size, dict) else size
    return {
        "class": getattr(processor, "name", type(processor).__name__),
        "min_pixels": int(size.get("shortest_edge") or getattr(processor, "min_pixels", 56 * 56)),
        "max_pixels": int(size.get("longest_edge") or getattr(processor, "max_pixels", 28 * 28 * 1280)),
        "patch_size": int(getattr(processor, "patch_size", 14)),
        "merge_size": int(getattr(processor, "merge_size", 2)),
        "temporal_patch_size": int(getattr(processor, "temporal_patch_size", 2)),
    }


def contract_settings(processor) -> dict:
    """:func:`processor_settings` with the resampler and the normalization: the processor contract."""
    return {
        **processor_settings(processor),
        "resample": resampler_name(getattr(processor, "resample", None)),
        "image_mean": [float(v) for v in getattr(processor, "image_mean", ())],
        "image_std": [float(v) for v in getattr(processor, "image_std", ())],
    }


@dataclass
class ProcessorRun:
    """What one call of the processor made of the images, and the facts about it."""

    pixel_values: np.ndarray  # [patches, C*T*P*P] float32, processor order
    grid_thw: np.ndarray  # [images, 3] int64
    sizes: list[tuple[int, int]]  # (height, width) as loaded
    resized: list[tuple[int, int]]  # (height, width) after the processor's resize
    conversions: list[str | None]  # what was done to make each image RGB (None: it was RGB)
    settings: dict


def run_processor(
    checkpoint: Checkpoint, image_paths: list[str | Path], processor=None, refuse_upscale: bool = True
) -> ProcessorRun:
    """Run ``processor`` (default: the checkpoint's) on the images; refuse images that cannot be resized and,
    with ``refuse_upscale``, images below its minimum pixels (it would upscale them, and the run would not
    test the image given; a family whose processor upscales by design records it instead)."""
    if not image_paths:
        raise InputError("no images given", "list at least one image under 'images' (or a video under 'videos')")
    processor = processor or load_image_processor(checkpoint)
    settings = processor_settings(processor)
    images, sizes, resized, conversions = [], [], [], []
    factor = settings["patch_size"] * settings["merge_size"]
    for path in image_paths:
        image, conversion = as_processor_sees(load_image(path), processor, path)
        conversions.append(conversion)
        width, height = image.size
        if refuse_upscale and width * height < settings["min_pixels"]:
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
    return ProcessorRun(
        np.asarray(out["pixel_values"], dtype=np.float32),
        np.asarray(out["image_grid_thw"], dtype=np.int64),
        sizes,
        resized,
        conversions,
        settings,
    )


PATCHING = ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std")


def stated_settings(path: str | Path) -> dict:
    """What the checkpoint's preprocessor_config.json states, in :func:`processor_settings`' terms (with
    ``resample`` and ``image_mean``/``image_std``); a setting it does not state is absent."""
    config_path = Path(path) / "preprocessor_config.json"
    try:
        data = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    size = data.get("size") if isinstance(data.get("size"), dict) else {}
    both = {"min_pixels": "shortest_edge", "max_pixels": "longest_edge"}
    conflicts = [
        f"preprocessor_config.json states {key} {data[key]} and size.{edge} {size[edge]}: transformers uses {key}"
        for key, edge in both.items()
        if key in data and edge in size and data[key] != size[edge]
    ]
    stated = {
        "min_pixels": data.get("min_pixels", size.get("shortest_edge")),
        "max_pixels": data.get("max_pixels", size.get("longest_edge")),
        "resample": None if data.get("resample") is None else resampler_name(data["resample"]),
        **{
            key: data.get(key) for key in ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std")
        },
    }
    stated = {key: value for key, value in stated.items() if value is not None}
    if conflicts:
        stated["conflicts"] = conflicts
    return stated


def contract_differences(ran: dict, stated: dict) -> list[str]:
    """Each setting the processor ran with that is not what preprocessor_config.json states (or that it
    does not state, so transformers' class default applied)."""
    differences = list(stated.get("conflicts", []))
    for key, value in ran.items():
        if key == "class":
            continue
        if key not in stated:
            differences.append(f"preprocessor_config.json does not state {key}: the class default {value} applied")
        elif _normal(stated[key]) != _normal(value):
            differences.append(f"{key} {value} differs from the checkpoint's preprocessor_config.json ({stated[key]})")
    return differences


def _normal(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(round(float(v), 8) for v in value)
    return value
