"""Shared pieces of the Molmo2 tests: the tiny checkpoints (built once per process) and their images."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "fixtures" / "images" / "shapes_448.png"


@functools.cache
def checkpoint_dirs() -> dict[str, Path]:
    """``{"hub": ..., "native": ...}``, built by fixtures/make_tiny_molmo2.py when absent."""
    from make_tiny_molmo2 import DEFAULT_ROOT, main

    hub, native = main([str(DEFAULT_ROOT)])
    return {"hub": hub, "native": native}


@functools.cache
def shapes_image(size: int) -> np.ndarray:
    """The shapes test image resized to ``size`` x ``size`` (8-bit RGB)."""
    from PIL import Image

    return np.asarray(Image.open(SHAPES).convert("RGB").resize((size, size), Image.Resampling.BILINEAR))


PROMPT = "<|im_end|><|image|><|im_start|>user\nDescribe the image.<|im_end|>\n<|im_start|>assistant\n"


@functools.cache
def shapes_inputs(size: int):
    """Molmo2 inputs for the shapes image at ``size`` px with a short prompt (hub checkpoint's tokenizer)."""
    from driftscope.families.molmo2.processor import prepare
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint_dirs()["hub"]))
    return prepare([shapes_image(size)], PROMPT, tokenizer)


@functools.cache
def config(layout: str = "hub") -> dict:
    import json

    return json.loads((checkpoint_dirs()[layout] / "config.json").read_text())


@functools.cache
def transformers_model(layout: str = "hub"):
    from driftscope.families.molmo2.transformers_taps import load_model

    return load_model(checkpoint_dirs()[layout])


@functools.cache
def reference_taps(size: int) -> dict[str, np.ndarray]:
    """transformers f32 (eager attention) taps of every stage on the hub checkpoint at ``size`` px."""
    from driftscope.families.molmo2.config import read_facts
    from driftscope.families.molmo2.transformers_taps import capture

    return capture(transformers_model("hub"), shapes_inputs(size), read_facts(config("hub")).selected_layers)


def max_abs(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())
