"""Qwen2.5-VL in JAX for the ``jax`` and ``iree`` runtimes, one module per concern: config, weights,
model (the tower), stages (single-stage replay functions), text (the decoder's prefill), program (what
the compiled runtimes ask: host stages, lowering, pieces, replay calls). Shared operators and the
precision contract live in ``driftscope.taps.jax.layers``."""

from .config import VisionSpec
from .model import vision_tower
from .weights import load_vision_weights

__all__ = ["VisionSpec", "load_vision_weights", "vision_tower"]
