"""What an image file holds, read without a processor: its size, and whether several files are one picture."""

from __future__ import annotations

from pathlib import Path


def image_size(path: str | Path) -> tuple[int, int]:
    """(height, width) of an image file."""
    from PIL import Image

    with Image.open(path) as image:
        return image.height, image.width


def same_pixels(paths: list[Path]) -> bool:
    """Whether every image decodes to the same RGB array (packed copies of one image leak nothing)."""
    import numpy as np
    from PIL import Image

    arrays = []
    for path in paths:
        with Image.open(path) as image:
            arrays.append(np.asarray(image.convert("RGB")))
    return all(a.shape == arrays[0].shape and np.array_equal(a, arrays[0]) for a in arrays[1:])
