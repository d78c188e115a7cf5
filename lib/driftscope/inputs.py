"""Shared inputs: the oracle's processor output that every runtime receives unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import Checkpoint
from .engine_inputs import inputs_digest
from .errors import InputError


@dataclass
class VisionInputs:
    """Pixel values and grids for one packed call of the vision tower."""

    pixel_values: np.ndarray  # (patches, C * T * P * P) float32, processor order
    grid_thw: np.ndarray  # (images, 3) int64
    image_paths: list[str]
    image_sizes: list[tuple[int, int]]  # (height, width) as loaded
    resized: list[tuple[int, int]] = field(default_factory=list)  # (height, width) after smart resize
    processor: dict = field(default_factory=dict)
    conversions: list[str | None] = field(default_factory=list)  # per image: how it became RGB (None: it was)
    text: Any = None  # TextInputs when the run follows the prompt past the vision tower

    @property
    def image_tokens(self) -> np.ndarray:
        merge = int(self.processor.get("merge_size", 2))
        return (self.grid_thw.prod(axis=1) // (merge * merge)).astype(np.int64)

    @property
    def digest(self) -> str:
        """What an engine's sidecar declares as ``inputs_digest`` (``engine_inputs.inputs_digest``)."""
        return inputs_digest(self.pixel_values, self.grid_thw, None if self.text is None else self.text.input_ids)

    def summary(self) -> dict:
        return {
            "images": self.image_paths,
            "image_sizes": [list(s) for s in self.image_sizes],
            "resized": [list(s) for s in self.resized],
            "grid_thw": self.grid_thw.tolist(),
            "image_tokens": self.image_tokens.tolist(),
            "patches": int(self.pixel_values.shape[0]),
            "digest": self.digest,
            "processor": self.processor,
            "conversions": self.conversions,
            **({"text": self.text.summary()} if self.text is not None else {}),
        }


def load_image(path: str | Path):
    """Open an image in its own mode (RGBA, L, P, ...), or say clearly why it cannot be used."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if not path.exists():
        raise InputError(
            f"image {path} does not exist",
            "check the path in 'images' (relative paths in a parameter file resolve against the repository "
            "holding it, or its own folder outside a repository)",
        )
    try:
        with Image.open(path) as handle:
            handle.load()
            return handle.copy()
    except (UnidentifiedImageError, OSError) as err:
        raise InputError(f"{path} is not an image PIL can read ({err})", "pass a PNG or JPEG file") from err


def as_processor_sees(image, processor, path: str | Path) -> tuple[Any, str | None]:
    """The RGB image the checkpoint's processor makes of ``image`` and what was done (None: it was RGB).

    Transparency is composited onto white and grayscale or palette images are expanded, with transformers'
    own ``convert_to_rgb`` (what the Qwen processors run when ``do_convert_rgb`` is set)."""
    from PIL import Image
    from transformers.image_transforms import convert_to_rgb

    if image.mode == "RGB":
        return image, None
    if not getattr(processor, "do_convert_rgb", True):
        raise InputError(
            f"image {path} is {image.mode}, and the checkpoint's processor does not convert images to RGB",
            "save the image as RGB, or set do_convert_rgb: true in the checkpoint's preprocessor_config.json",
        )
    alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    done = "transparency composited onto white" if alpha else "converted to RGB"
    converted = Image.fromarray(convert_to_rgb(image, return_numpy=True))
    return converted, f"{image.mode}: {done} (as the processor's convert_to_rgb does)"


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


def prepare_inputs(checkpoint: Checkpoint, image_paths: list[str | Path]) -> VisionInputs:
    """Run the checkpoint's processor on the images; refuse images below its minimum pixels."""
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
    return VisionInputs(
        pixel_values=np.asarray(out["pixel_values"], dtype=np.float32),
        grid_thw=np.asarray(out["image_grid_thw"], dtype=np.int64),
        image_paths=[str(p) for p in image_paths],
        image_sizes=sizes,
        resized=[tuple(int(v) for v in r) for r in resized],
        processor=settings,
        conversions=conversions,
    )
