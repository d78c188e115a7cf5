"""Shared, cached pieces of the Qwen3-VL tests: the tiny checkpoint, processor outputs, prompts and the
transformers f32 reference taps (computed once per process, whichever test file asks first)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY_QWEN3 = ROOT / "fixtures" / "checkpoints" / "tiny-qwen3-vl"

#: Image sets of the agreement tests: one 224x224 image (resized to 256x256 by Qwen3-VL's min pixels),
#: one 448x448 image, two different 256x256 images packed into one 512-patch call, and the second alone.
CASES = {
    "224": ("shapes", 224),
    "448": ("shapes", 448),
    "two-256": ("shapes", 256, "mirrored", 256),
    "mirrored-256": ("mirrored", 256),
}

#: The issue's agreement bound for every f32 runtime against transformers f32.
TOLERANCE = 1e-4


@cache
def checkpoint_dir() -> Path:
    if not (TINY_QWEN3 / "model.safetensors").exists():
        from make_tiny_qwen3vl import main

        main([str(TINY_QWEN3)])
    return TINY_QWEN3


@cache
def config() -> dict:
    return json.loads((checkpoint_dir() / "config.json").read_text())


def _image(kind: str, size: int):
    from make_shapes import draw_shapes
    from PIL import ImageOps

    image = draw_shapes(size)
    return ImageOps.mirror(image) if kind == "mirrored" else image


@dataclass(frozen=True)
class Case:
    pixel_values: np.ndarray
    grid_thw: np.ndarray
    input_ids: np.ndarray
    image_token_id: int

    @property
    def image_slots(self) -> np.ndarray:
        return np.flatnonzero(self.input_ids == self.image_token_id).astype(np.int32)


@cache
def case(name: str) -> Case:
    """The processor output (transformers' PIL image processor saved with the checkpoint) and the prompt."""
    from driftscope.checkpoint import Checkpoint
    from driftscope.text_inputs import build_text_inputs
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    spec = CASES[name]
    images = [_image(spec[i], spec[i + 1]) for i in range(0, len(spec), 2)]
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(checkpoint_dir()))
    features = processor(images=images, return_tensors="np")
    grid = np.asarray(features["image_grid_thw"], dtype=np.int64)
    text = build_text_inputs(Checkpoint(checkpoint_dir(), config(), "qwen3_vl"), [int(g.prod()) // 4 for g in grid])
    return Case(np.asarray(features["pixel_values"], np.float32), grid, text.input_ids, text.image_token_id)


@cache
def transformers_model():
    from driftscope.families.qwen3_vl.transformers_taps import load_model

    return load_model(checkpoint_dir())


@cache
def reference(name: str) -> dict[str, np.ndarray]:
    """transformers f32 taps of one case: every vision stage and the text prefill."""
    from driftscope.families.qwen3_vl import transformers_taps

    c, model = case(name), transformers_model()
    taps = transformers_taps.capture_vision(model, c.pixel_values, c.grid_thw)
    taps.update(transformers_taps.capture_text(model, c.input_ids, c.pixel_values, c.grid_thw, c.image_token_id))
    return taps


def max_errors(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], keys) -> dict[str, float]:
    """max |got - expected| per key (shapes must agree)."""
    errors = {}
    for key in keys:
        assert got[key].shape == expected[key].shape, (key, got[key].shape, expected[key].shape)
        errors[key] = float(np.max(np.abs(got[key].astype(np.float64) - expected[key].astype(np.float64))))
    return errors


#: Padding rows added to every JAX bucket: real rows must not see them.
PADDING = 8


@cache
def emitter_weights():
    from driftscope.families.qwen3_vl.emitter import TextSpec, VisionSpec, load_text_weights, load_vision_weights

    vision, text = VisionSpec.from_config(config()), TextSpec.from_config(config())
    return vision, text, load_vision_weights(checkpoint_dir(), vision), load_text_weights(checkpoint_dir(), text)


def vision_stage_ids() -> list[str]:
    """The plan's vision stages every runtime computes (bounds come from the geometry, not the graph)."""
    from driftscope.families.qwen3_vl.plan import vision_plan

    return [s.id for s in vision_plan(config()) if s.id.startswith("vision.") and s.id != "vision.cu_seqlens"]


@cache
def run_tower(name: str, spec=None) -> dict[str, np.ndarray]:
    """The JAX tower (f32, every plan stage tapped) on one case, packed with ``PADDING`` garbage rows."""
    import jax
    from driftscope.families.qwen3_vl.emitter import vision_tower
    from driftscope.families.qwen3_vl.emitter.layers import Contract
    from driftscope.families.qwen3_vl.geometry import pack_bucket

    vision, _, vision_weights, _ = emitter_weights()
    spec = spec or vision
    c = case(name)
    bucket = pack_bucket(c.grid_thw, spec.grid_side, rows=len(c.pixel_values) + PADDING)
    pixels = np.full((bucket.rows, spec.patch_dim), 7.0, np.float32)  # padding rows hold garbage on purpose
    pixels[: bucket.active] = c.pixel_values
    taps = tuple(vision_stage_ids())
    out = jax.jit(lambda w, *a: vision_tower(w, *a, spec=spec, contract=Contract(), taps=taps))(
        vision_weights, pixels, *bucket.graph_inputs().values()
    )
    merged = bucket.active_merged
    return {k: np.asarray(v)[: merged if v.shape[0] == bucket.rows // 4 else bucket.active] for k, v in out.items()}


@cache
def jax_taps(name: str) -> dict[str, np.ndarray]:
    """The JAX tower and text prefill (f32) of one case; positions from driftscope's M-RoPE geometry."""
    import jax
    import jax.numpy as jnp
    from driftscope.families.qwen3_vl.emitter import text_prefill
    from driftscope.families.qwen3_vl.emitter.layers import Contract
    from driftscope.geometry import mrope_positions

    _, text_spec, _, text_weights = emitter_weights()
    c = case(name)
    taps = dict(run_tower(name))
    image = (c.input_ids == c.image_token_id).astype(int)
    positions, _ = mrope_positions(image.tolist(), c.grid_thw.tolist(), 2)
    deepstack = jnp.stack(
        [taps[f"vision.deepstack.{k}"] for k in range(len(emitter_weights()[0].deepstack_visual_indexes))]
    )
    wanted = tuple(f"text.layer.{i}.hidden" for i in range(text_spec.layers))
    out = jax.jit(lambda w, *a: text_prefill(w, *a, spec=text_spec, contract=Contract(), taps=wanted))(
        text_weights,
        c.input_ids.astype(np.int32),
        c.image_slots,
        taps["vision.merger"],
        deepstack,
        positions.astype(np.int32),
    )
    taps.update({k: np.asarray(v) for k, v in out.items()})
    taps["text.position_ids"] = positions
    return taps


@cache
def mlx_model():
    from driftscope.families.qwen3_vl.mlx_config import load_mlx_model

    return load_mlx_model(checkpoint_dir(), config())


@cache
def mlx_taps(name: str) -> dict[str, np.ndarray]:
    """mlx-vlm f32 taps of one case: every vision stage and the text prefill."""
    from driftscope.families.qwen3_vl import mlx_taps as taps

    c = case(name)
    out = taps.capture_vision(mlx_model(), c.pixel_values, c.grid_thw)
    out.update(taps.capture_text(mlx_model(), c.input_ids, c.pixel_values, c.grid_thw))
    return out
