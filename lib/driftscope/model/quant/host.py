"""Quantize a dense checkpoint's weights on the host, and the dequantized dense weights every runtime can run.

The weights are read as float32 (exactly widened), quantized with ``mx.quantize`` (float32 scales),
and keyed by the checkpoint's own tensor names, so the transformers oracle and the JAX/IREE path
take the dense result where they take the checkpoint's tensors. A policy's activation dtype casts
the scales and biases first (what ``Module.set_dtype`` does to a quantized MLX model), then
dequantizes in that dtype: the dense weights equal what MLX's quantized layers compute with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.model.quant.affine import QuantizedTensor, quantize
from driftscope.model.quant.policy import QuantSpec
from driftscope.model.quant.select import Selection, TensorGroups, select_weights
from driftscope.model.weightfile import TensorFiles


@dataclass
class HostQuantization:
    """The quantized matrices of one checkpoint under one :class:`QuantSpec`, by checkpoint tensor name."""

    spec: QuantSpec
    selection: Selection
    quantized: dict[str, QuantizedTensor]

    def dequantized(self, activations: Any = None) -> dict[str, np.ndarray]:
        """``{name: dense weight}`` of the quantized matrices, in ``activations`` (default: the spec's)."""
        dtype = activations or self.spec.activations
        return {name: tensor.with_scale_dtype(dtype).dequantize() for name, tensor in self.quantized.items()}

    def dense_weights(self, weights: Mapping[str, np.ndarray], activations: Any = None) -> dict[str, np.ndarray]:
        """``weights`` with every quantized matrix replaced by its dequantized form."""
        return {**weights, **self.dequantized(activations)}

    def report(self) -> dict[str, Any]:
        """What the report records: the spec, how many matrices were quantized, which stayed dense and why."""
        return {"spec": self.spec.to_dict(), **self.selection.to_dict()}


def quantize_weights(weights: Mapping[str, np.ndarray], groups: TensorGroups, spec: QuantSpec) -> HostQuantization:
    """Quantize the matrices of ``weights`` that ``spec.scope`` selects (``weights`` keep their dtype)."""
    selection = select_weights(
        {name: value.shape for name, value in weights.items()}, groups, spec.group_size, spec.scope
    )
    quantized = {name: quantize(weights[name], spec.group_size, spec.bits, spec.mode) for name in selection.quantized}
    return HostQuantization(spec, selection, quantized)


def quantize_checkpoint(path: str | Path, groups: TensorGroups, spec: QuantSpec) -> HostQuantization:
    """Quantize a dense checkpoint directory's selected matrices, read as float32 one tensor at a time."""
    files = TensorFiles(path)
    selection = select_weights({name: files.shape(name) for name in files.names()}, groups, spec.group_size, spec.scope)
    quantized = {
        name: quantize(files.read(name), spec.group_size, spec.bits, spec.mode) for name in selection.quantized
    }
    return HostQuantization(spec, selection, quantized)
