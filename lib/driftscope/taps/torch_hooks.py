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
