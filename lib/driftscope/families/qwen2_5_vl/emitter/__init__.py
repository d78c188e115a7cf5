"""Qwen2.5-VL vision tower in JAX, one module per concern (config, weights, layers, model)."""

from .config import VisionSpec
from .model import vision_tower
from .weights import load_vision_weights

__all__ = ["VisionSpec", "load_vision_weights", "vision_tower"]
