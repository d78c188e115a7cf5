"""The Qwen3-VL vision tower (with DeepStack branches) and text decoder in JAX, one module per concern."""

from .config import TextSpec, VisionSpec
from .model import vision_tower
from .text import text_prefill
from .weights import load_text_weights, load_vision_weights

__all__ = ["TextSpec", "VisionSpec", "load_text_weights", "load_vision_weights", "text_prefill", "vision_tower"]
