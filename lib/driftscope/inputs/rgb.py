"""An image in RGB as Hugging Face image processors make it, without importing transformers.

The notebooks draw the run's inputs as the processor saw them, and a run prepares its inputs with it
(``processor_output.as_processor_sees``); importing ``transformers.image_transforms`` for that imports torch and
transformers (~4.7 CPU-seconds on the CI machine). tests/inputs/test_rgb.py holds this one equal to transformers'
own on every PIL mode.
"""

from __future__ import annotations

from PIL import Image


def has_transparency(image: Image.Image) -> bool:
    """An alpha band, or a transparent colour (palette and grayscale images carry it in ``info``)."""
    return "A" in image.getbands() or image.info.get("transparency") is not None


def to_rgb(image: Image.Image) -> Image.Image:
    """``transformers.image_transforms.convert_to_rgb`` of a PIL image: transparency composited onto white, any
    other mode converted by PIL."""
    if has_transparency(image):
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")
