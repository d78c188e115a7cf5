"""Qwen3-VL-MoE's sparse layers' stages that are a module's output or input, declared for both sides
(``taps.module_taps``): paths from the decoder (transformers' ``model.model.language_model``, mlx-vlm's
``language_model.model``: the same names). The router's logits, the chosen experts and their weights, and each
chosen expert's output are not a module's output or input as they stand (sorted by expert id, weighed, or one
expert slot at a time): ``transformers_taps`` and ``mlx_taps`` write them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from driftscope.taps.module_taps import ModuleTap, argument, both, output


def _rows(array: np.ndarray) -> np.ndarray:
    return array[0]


def sparse_taps(layers: Iterable[int]) -> list[ModuleTap]:
    """Each sparse layer's MLP input before and after its norm, and the MLP's output (the prompt's rows)."""
    return [
        tap
        for index in layers
        for tap in (
            both(f"text.layer.{index}.residual1", argument(f"layers.{index}.post_attention_layernorm", _rows)),
            both(f"text.layer.{index}.mlp.in", output(f"layers.{index}.post_attention_layernorm", _rows)),
            both(f"text.layer.{index}.mlp", output(f"layers.{index}.mlp", _rows)),
        )
    ]
