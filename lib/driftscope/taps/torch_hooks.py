"""What a family's transformers taps are written with: tensors to numpy, and a module attribute replaced
inside a block (a function the forward looks up, wrapped to record)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np


def to_numpy(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


@contextmanager
def replaced(module: Any, name: str, value: Any):
    """``module.name`` is ``value`` inside the block (a function the forward looks up, wrapped to record)."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield original
    finally:
        setattr(module, name, original)


def cache_snapshot(cache: Any):
    """``cache_snapshot(kind)`` of a transformers ``DynamicCache`` (``taps.sink.CacheSnapshot``): each attention
    layer's keys or values ``[kv_heads, positions, head_dim]`` as it holds them now (half precision widened, exact).
    A layer that holds no keys (a hybrid model's convolution or linear-attention state) is left out;
    ``snapshot.layers()`` names the decoder layers the snapshot holds."""

    def layers() -> list[int]:
        return [index for index, layer in enumerate(cache.layers) if hasattr(layer, "keys")]

    def snapshot(kind: str):
        for index in layers():
            yield getattr(cache.layers[index], kind)[0].detach().float().cpu().numpy()

    snapshot.layers = layers
    return snapshot
