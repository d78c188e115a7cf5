"""Shared inputs: the oracle's processor output that every runtime receives unchanged.

What the arrays are is the family's business (``Family.prepare_inputs``): pixel values and grids for
one family, crops and pooling indices for another. Here they are named arrays with a digest and a
summary, and each becomes an ``inputs.<name>`` stage of every capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import InputError
from driftscope.inputs.engine_inputs import inputs_digest


@dataclass
class ModelInputs:
    """The processor output for one packed call, as named arrays, and what the summary shows of it."""

    arrays: dict[str, np.ndarray]  # processor outputs by name, in digest order
    image_paths: list[str]
    image_sizes: list[tuple[int, int]]  # (height, width) as loaded
    image_tokens: np.ndarray  # prompt placeholders each image takes
    facts: dict = field(default_factory=dict)  # the family's facts for the summary (resized sizes, grids, ...)
    headline: str = ""  # one line for the log
    text: Any = None  # TextInputs when the run follows the prompt past the vision tower
    warnings: list[str] = field(default_factory=list)  # what the report must say about these inputs
    video_paths: list[str] = field(default_factory=list)  # videos packed after the images (facts["videos"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    @property
    def digest(self) -> str:
        """sha256 over each array's little-endian bytes (in ``arrays`` order, as stored), then the prompt's token
        ids as int64: what an engine's sidecar declares as ``inputs_digest`` (``engine_inputs.inputs_digest``)."""
        return inputs_digest(self.arrays, None if self.text is None else self.text.input_ids)

    def stages(self) -> dict[str, np.ndarray]:
        """The ``inputs.*`` stages every capture writes: each array, and the image tokens per image."""
        return {
            **{f"inputs.{name}": array for name, array in self.arrays.items()},
            "inputs.image_tokens": self.image_tokens,
        }

    def summary(self) -> dict:
        return {
            "images": self.image_paths,
            "image_sizes": [list(s) for s in self.image_sizes],
            **self.facts,
            "image_tokens": self.image_tokens.tolist(),
            "digest": self.digest,
            **({"text": self.text.summary()} if self.text is not None else {}),
            **({"warnings": list(self.warnings)} if self.warnings else {}),
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
            frames = int(getattr(handle, "n_frames", 1))
            kind = handle.format or path.suffix.lstrip(".").upper() or "image"  # a copy no longer knows its format
            handle.load()
            image = handle.copy()
    except (UnidentifiedImageError, OSError) as err:
        raise InputError(f"{path} is not an image PIL can read ({err})", "pass a PNG or JPEG file") from err
    if frames > 1:  # PIL would hand over the first frame alone: the others would be dropped without a word
        raise InputError(
            f"image {path} has {frames} frames (an animated {kind}); driftscope compares one still "
            "image per entry of 'images'",
            "list it under 'videos' to compare it as a video (families that take video), or pass one frame "
            "(e.g. save the frame you mean as a PNG) under 'images'",
        )
    return image


def as_processor_sees(image, processor, path: str | Path) -> tuple[Any, str | None]:
    """The RGB image the checkpoint's processor makes of ``image`` and what was done (None: it was RGB).

    Transparency is composited onto white and grayscale or palette images are expanded, as transformers' own
    ``convert_to_rgb`` does (what Hugging Face image processors run when ``do_convert_rgb`` is set;
    ``inputs.rgb``, tests/inputs/test_rgb.py holds the two equal on every PIL mode), without importing it."""
    from driftscope.inputs.rgb import has_transparency, to_rgb

    if image.mode == "RGB":
        return image, None
    if not getattr(processor, "do_convert_rgb", True):
        raise InputError(
            f"image {path} is {image.mode}, and the checkpoint's processor does not convert images to RGB",
            "save the image as RGB, or set do_convert_rgb: true in the checkpoint's preprocessor_config.json",
        )
    done = "transparency composited onto white" if has_transparency(image) else "converted to RGB"
    converted = to_rgb(image)
    return converted, f"{image.mode}: {done} (as the processor's convert_to_rgb does)"
