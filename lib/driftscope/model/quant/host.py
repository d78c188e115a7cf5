"""Quantize a dense checkpoint's weights on the host, and the dequantized dense weights every runtime can run.

The weights are read as float32 (exactly widened), quantized with ``mx.quantize`` (float32 scales),
and keyed by the checkpoint's own tensor names, so the transformers oracle and the JAX/IREE path
take the dense result where they take the checkpoint's tensors. A tensor MLX holds as several (a family's
:class:`~driftscope.model.quant.names.Joined`: stacked experts' ``gate_up_proj``) is split into MLX's parts
and layout first, each part quantized as ``nn.quantize`` quantizes that module, and joined back when
dequantized. A policy's activation dtype casts the scales and biases first (what ``Module.set_dtype`` does
to a quantized MLX model), then dequantizes in that dtype: the dense weights equal what MLX's quantized
layers compute with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.model.quant.affine import QuantizedTensor, quantize
from driftscope.model.quant.names import NameMap
from driftscope.model.quant.policy import QuantSpec
from driftscope.model.quant.select import Selection, TensorGroups, select_weights
from driftscope.model.weightfile import TensorFiles


@dataclass
class HostQuantization:
    """The quantized matrices of one checkpoint under one :class:`QuantSpec`, by checkpoint tensor name."""

    spec: QuantSpec
    selection: Selection
    quantized: dict[str, QuantizedTensor]
    #: parts of joined tensors, by MLX name and in MLX's layout (``names`` joins them back)
    parts: dict[str, QuantizedTensor] = field(default_factory=dict)
    names: NameMap | None = None

    def dequantized(self, activations: Any = None) -> dict[str, np.ndarray]:
        """``{name: dense weight}`` of the quantized matrices, in ``activations`` (default: the spec's)."""
        dtype = activations or self.spec.activations
        dense = {name: tensor.with_scale_dtype(dtype).dequantize() for name, tensor in self.quantized.items()}
        if self.parts:
            parts = {name: tensor.with_scale_dtype(dtype).dequantize() for name, tensor in self.parts.items()}
            dense.update(self.names.weights_to_checkpoint(parts))
        return dense

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


def select_checkpoint(
    files: TensorFiles,
    groups: TensorGroups,
    spec: QuantSpec,
    names: NameMap | None = None,
    mlx_groups: TensorGroups | None = None,
) -> Selection:
    """What :func:`quantize_checkpoint` quantizes: checkpoint names, and the MLX names of joined tensors' parts."""
    joined = [name for name in files.names() if names is not None and names.split_of(name) is not None]
    shapes = {name: files.shape(name) for name in files.names() if name not in joined}
    selection = select_weights(shapes, groups, spec.group_size, spec.scope, required=not joined)
    if not joined:
        return selection
    shapes = {}
    for name in joined:
        part_shape = names.split_of(name).part_shape(files.shape(name))
        shapes.update(dict.fromkeys(names.parts_of(name), part_shape))
    stacked = select_weights(shapes, mlx_groups, spec.group_size, spec.scope, required=not selection.quantized)
    return Selection(
        spec.scope,
        spec.group_size,
        selection.quantized + stacked.quantized,
        selection.left_dense + stacked.left_dense,
    )


def quantize_checkpoint(
    path: str | Path,
    groups: TensorGroups,
    spec: QuantSpec,
    names: NameMap | None = None,
    mlx_groups: TensorGroups | None = None,
) -> HostQuantization:
    """Quantize a dense checkpoint directory's selected matrices, read as float32 one tensor at a time.

    With ``names`` (and ``mlx_groups``, the same groups in MLX's naming), the checkpoint tensors ``names`` joins
    are split into MLX's parts, selected in MLX's naming (stacked experts included) and quantized part by part.
    """
    files = TensorFiles(path)
    selection = select_checkpoint(files, groups, spec, names, mlx_groups)
    quantized, parts = {}, {}
    split: dict[str, np.ndarray] = {}
    present = set(files.names())
    for name in selection.quantized:
        if name in present:
            quantized[name] = quantize(files.read(name), spec.group_size, spec.bits, spec.mode)
            continue
        if name not in split:
            split.update(names.weights_to_mlx({names.to_checkpoint(name): files.read(names.to_checkpoint(name))}))
        parts[name] = quantize(split.pop(name), spec.group_size, spec.bits, spec.mode)
    return HostQuantization(spec, selection, quantized, parts, names)
