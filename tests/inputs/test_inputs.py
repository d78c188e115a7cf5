"""Inputs: the family's processor output as named arrays, and the digest every sidecar declares."""

from __future__ import annotations

import hashlib

import numpy as np
from conftest import SHAPES


def test_the_digest_hashes_pixel_values_then_grids_then_prompt_ids(tiny_checkpoint, shapes_inputs):
    """Byte for byte what engines outside Python compute: float32 pixel values, int64 grids, int64 ids."""
    from driftscope.families import get_family

    sha = hashlib.sha256()
    sha.update(np.ascontiguousarray(shapes_inputs["pixel_values"], dtype=np.float32).tobytes())
    sha.update(np.ascontiguousarray(shapes_inputs["grid_thw"], dtype=np.int64).tobytes())
    assert shapes_inputs.digest == sha.hexdigest()[:16]
    assert list(shapes_inputs.arrays) == ["pixel_values", "grid_thw"]
    family = get_family(tiny_checkpoint.family)
    prompted = family.prepare_inputs(tiny_checkpoint, [SHAPES])
    prompted.text = family.text_inputs(tiny_checkpoint, prompted)
    sha.update(np.ascontiguousarray(prompted.text.input_ids, dtype=np.int64).tobytes())
    assert prompted.digest == sha.hexdigest()[:16] != shapes_inputs.digest


def test_every_array_is_an_inputs_stage_and_the_summary_shows_the_family_facts(shapes_inputs):
    stages = shapes_inputs.stages()
    assert list(stages) == ["inputs.pixel_values", "inputs.grid_thw", "inputs.image_tokens"]
    assert stages["inputs.image_tokens"].tolist() == [256]  # 448x448: a 32x32 patch grid merged 2x2
    summary = shapes_inputs.summary()
    assert summary["grid_thw"] == [[1, 32, 32]] and summary["patches"] == 1024 and summary["resized"] == [[448, 448]]
    assert summary["digest"] == shapes_inputs.digest and shapes_inputs.headline == "grid [[1, 32, 32]], 1024 patches"


def test_an_animated_image_is_refused_naming_its_format(tmp_path):
    """PIL's copy of an image no longer knows its format: the message names the file's own ("animated GIF")."""
    import pytest
    from driftscope.errors import InputError
    from driftscope.inputs.processor_output import load_image
    from PIL import Image

    path = tmp_path / "moving.gif"
    frames = [Image.new("RGB", (8, 8), (10 * k, 0, 0)) for k in range(3)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100)
    with pytest.raises(InputError, match=r"has 3 frames \(an animated GIF\)") as caught:
        load_image(path)
    assert "None" not in caught.value.problem
