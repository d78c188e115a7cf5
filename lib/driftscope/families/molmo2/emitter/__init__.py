"""Molmo2 in JAX, one module per concern: config, weights, layers, model (ViT, pooling, projector),
stages (single-stage functions for replay) and text (the decoder's prefill)."""

from .config import Molmo2Spec
from .model import FINAL, forward, vision_features
from .weights import load_weights

__all__ = ["FINAL", "Molmo2Spec", "forward", "load_weights", "vision_features"]
