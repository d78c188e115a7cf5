"""Qwen2-VL's image processor in NumPy (``qwen_shared.image_processor``) against transformers' own
``Qwen2VLImageProcessorPil``, bit for bit: every Qwen checkpoint the fixtures hold (the families' tiny ones and
the model testers' settings: patch 14 and 16, merge 1 and 2, CLIP and 0.5 normalization), on images of every PIL
mode, odd sizes, one the bounds upscale and one they shrink."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import ROOT
from driftscope.families.qwen_shared.image_processor import numpy_image_processor, smart_resize
from driftscope.families.qwen_shared.processor import contract_settings, processor_settings
from PIL import Image

CHECKPOINTS = sorted(
    path.name
    for path in (ROOT / "fixtures" / "checkpoints").iterdir()
    if (path / "preprocessor_config.json").exists()
    and "Qwen2VLImageProcessor" in (path / "preprocessor_config.json").read_text()
)


def _images(tmp_path) -> list[Image.Image]:
    rng = np.random.default_rng(52)
    pixels = rng.integers(0, 256, (517, 300, 4), dtype=np.uint8)
    images = [
        Image.open(ROOT / "fixtures" / "images" / "shapes_448.png").convert("RGB"),
        Image.fromarray(pixels[..., :3]),  # 517x300: neither side a multiple of the factor
        Image.fromarray(pixels[:60, :50, :3]),  # below the minimum pixels: upscaled
        Image.fromarray(np.tile(pixels[:90, :40, :3], (1, 25, 1))),  # 90x1000: wide
        Image.fromarray(pixels, "RGBA"),
        Image.fromarray(pixels[..., 0], "L"),
        Image.fromarray(pixels[..., :3]).convert("P"),
        Image.fromarray(pixels[..., :2], "LA"),
    ]
    return images


def _rgb_as_transformers(image: Image.Image) -> Image.Image:
    from transformers.image_transforms import convert_to_rgb

    return Image.fromarray(convert_to_rgb(image, return_numpy=True))


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_the_numpy_processor_is_transformers_own_bit_for_bit(name, tmp_path):
    from driftscope.inputs.rgb import to_rgb
    from transformers import AutoImageProcessor

    path = ROOT / "fixtures" / "checkpoints" / name
    ours = numpy_image_processor(path)
    assert ours is not None, f"{name}: its preprocessor_config.json should be reproduced"
    theirs = AutoImageProcessor.from_pretrained(str(path), backend="pil")
    assert processor_settings(ours)["class"] == "Qwen2VLImageProcessorPil (NumPy)"
    assert {**contract_settings(ours), "class": None} == {**contract_settings(theirs), "class": None}
    images = _images(tmp_path)
    factor = ours.patch_size * ours.merge_size
    for image in images:
        rgb = _rgb_as_transformers(image)
        np.testing.assert_array_equal(np.asarray(to_rgb(image)), np.asarray(rgb))
        expected = theirs(images=[rgb], return_tensors="np")
        got = ours([to_rgb(image)])
        np.testing.assert_array_equal(got["image_grid_thw"], expected["image_grid_thw"])
        assert got["pixel_values"].dtype == np.float32
        np.testing.assert_array_equal(got["pixel_values"], np.asarray(expected["pixel_values"], dtype=np.float32))
        size = smart_resize(image.height, image.width, factor, ours.min_pixels, ours.max_pixels)
        assert list(got["image_grid_thw"][0][1:] * ours.patch_size) == list(size)
    together = ours([to_rgb(image) for image in images[:3]])  # several images: patches concatenated in order
    expected = theirs(images=[_rgb_as_transformers(image) for image in images[:3]], return_tensors="np")
    np.testing.assert_array_equal(together["pixel_values"], expected["pixel_values"])


def test_smart_resize_is_transformers_own():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as theirs

    rng = np.random.default_rng(0)
    for height, width in rng.integers(20, 4000, (200, 2)):
        for factor, low, high in ((28, 56 * 56, 28 * 28 * 1280), (32, 65536, 16777216), (14, 3136, 12845056)):
            assert smart_resize(int(height), int(width), factor, low, high) == theirs(
                int(height), int(width), factor, low, high
            )
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 3000)


def test_a_config_it_does_not_reproduce_is_left_to_transformers(tmp_path):
    source = ROOT / "fixtures" / "checkpoints" / CHECKPOINTS[0]
    for change in ({"do_center_crop": True}, {"image_processor_type": "SiglipImageProcessor"}):
        folder = tmp_path / next(iter(change))
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors"))
        config = json.loads((folder / "preprocessor_config.json").read_text())
        (folder / "preprocessor_config.json").write_text(json.dumps({**config, **change}))
        assert numpy_image_processor(folder) is None
    # overrides (Qwen3-VL's `resample`) are applied as transformers applies them
    ours = numpy_image_processor(source, resample=Image.Resampling.BILINEAR)
    assert ours.resample == int(Image.Resampling.BILINEAR)
