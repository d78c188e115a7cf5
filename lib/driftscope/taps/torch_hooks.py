"""What a family's transformers taps are written with: tensors to numpy, a module call's main input and output
tensor, and a module attribute replaced inside a block (a function the forward looks up, wrapped to record)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from .outputs import call_input, output_at


def is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def first_tensor(value: Any):
    """The first tensor in a module's output (a tensor, a tuple or list, or a ModelOutput / dict)."""
    return output_at(value, None, is_tensor)


def output_tensor(value: Any, item: list | tuple | None = None):
    """The tensor a module's output holds at ``item`` (the probe's ``out_item``), else its first tensor."""
    return output_at(value, item, is_tensor)


def main_input(args: tuple, kwargs: dict, keywords: tuple[str, ...] = ()):
    """A module call's main input: its first positional tensor, else the first of ``keywords`` holding one, else any
    tensor keyword."""
    return call_input(args, kwargs, is_tensor, keywords)


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
