"""``inputs.rgb.to_rgb`` is transformers' ``convert_to_rgb`` (the reference, imported here) on every PIL mode an
image file can hold, transparency included; and notebook 01's kernel draws the inputs without importing torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from driftscope.inputs.rgb import has_transparency, to_rgb
from PIL import Image


def _images() -> dict[str, Image.Image]:
    """One image per mode, with values that make every channel matter (a gradient, half-transparent alpha)."""
    rng = np.random.default_rng(7)
    rgba = Image.fromarray(rng.integers(0, 256, (9, 11, 4), dtype=np.uint8), "RGBA")
    images = {mode: rgba.convert(mode) for mode in ("RGB", "RGBA", "LA", "L", "1", "CMYK", "YCbCr", "I", "F")}
    images["P"] = rgba.convert("RGB").quantize(16)
    transparent = images["P"].copy()
    transparent.info["transparency"] = 3  # palette index 3 is transparent: the processor composites it onto white
    images["P-transparency"] = transparent
    gray = images["L"].copy()
    gray.info["transparency"] = int(np.asarray(gray)[0, 0])
    images["L-transparency"] = gray
    images["PA"] = images["P"].convert("PA")
    return images


@pytest.mark.parametrize("name", sorted(_images()))
def test_to_rgb_is_transformers_convert_to_rgb(name):
    from transformers.image_transforms import convert_to_rgb

    image = _images()[name]
    expected = convert_to_rgb(image, return_numpy=True)
    got = to_rgb(image)
    assert got.mode == "RGB" and got.size == image.size
    np.testing.assert_array_equal(np.asarray(got), expected)
    assert has_transparency(image) == (name in {"RGBA", "LA", "PA", "P-transparency", "L-transparency"})


def test_notebook_01s_kernel_imports_neither_torch_nor_transformers(rendered):
    """The warm-up a kernel runs before the report exists, then the inputs figure, in a fresh interpreter."""
    _, out = rendered
    script = f"""
import sys
from pathlib import Path
from driftscope.views.warm import warm_up_code
exec(warm_up_code(Path({str(ROOT / "notebooks" / "01_stage_parity.ipynb")!r})))
from driftscope.run.report import Report
from driftscope.views.plots import input_images
input_images(Report.load(Path({str(out / "report.json")!r})))
print(sorted(name for name in ("torch", "transformers", "mlx", "jax") if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT / "notebooks")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
