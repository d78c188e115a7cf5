"""Same-input control for a quantized linear: the fused kernel and the dequantized weights on one input.

Both paths run in MLX on the same activation (the reference's own input to the layer), with the
scales cast to the activation dtype as ``Module.set_dtype`` casts them: ``fused`` is
``mx.quantized_matmul`` (what ``nn.QuantizedLinear`` calls; on the CPU a running sum in the activation
dtype), ``dequantized`` an ordinary matmul with the host-dequantized weight. Their gap is the fused
kernel's own error; measured against a reference output (the float32 oracle's) it says whether a
linear's error is introduced by the fused kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from driftscope.core.numeric import relative_rms
from driftscope.model.quant.affine import QuantizedTensor, from_mlx, mlx_core, numpy_dtype, to_mlx

#: one error source is named alone when it exceeds the other this many times
FACTOR = 4.0
#: relative RMS below which a deviation is float32 round-off, not a cause (the fused kernel sums sequentially,
#: a dense GEMM on OpenBLAS in blocks: in float32 they differ by ~1e-6 relative at 4096 inputs)
FLOOR = 1e-5


@dataclass(frozen=True)
class LinearReplay:
    """One quantized linear replayed on one input (outputs widened to float32)."""

    name: str
    activations: str
    fused: np.ndarray
    dequantized: np.ndarray
    reference: np.ndarray | None = None

    @property
    def fused_vs_dequantized(self) -> float:
        return relative_rms(self.fused, self.dequantized)

    @property
    def label(self) -> str:
        """Which of the fused kernel and the activation dtype this linear's error comes from.

        The fused path's gap to the dequantized one is the kernel's own error; the dequantized path's error
        against the reference is the activation dtype's (both ran the same weights). One dominating the
        other ``FACTOR`` times names it alone; comparable ones name both; both under ``FLOOR``: ``none``.
        """
        gap = self.fused_vs_dequantized
        own = relative_rms(self.dequantized, self.reference) if self.reference is not None else 0.0
        if max(gap, own) <= FLOOR:
            return "none"
        if gap > FACTOR * own:
            return "fused kernel"
        if own > FACTOR * gap:
            return "activation dtype"
        return "fused kernel + activation dtype"

    def to_dict(self) -> dict[str, Any]:
        row = {
            "name": self.name,
            "activations": self.activations,
            "fused_vs_dequantized": self.fused_vs_dequantized,
            "max_abs_fused_vs_dequantized": float(np.max(np.abs(self.fused - self.dequantized), initial=0.0)),
            "label": self.label,
        }
        if self.reference is not None:
            row["fused_vs_reference"] = relative_rms(self.fused, self.reference)
            row["dequantized_vs_reference"] = relative_rms(self.dequantized, self.reference)
        return row


def layer_of(module: Any) -> tuple[QuantizedTensor, np.ndarray | None]:
    """The quantized weight and the dense bias of an ``nn.QuantizedLinear`` (or ``QuantizedEmbedding``)."""
    tensor = QuantizedTensor(
        from_mlx(module["weight"]),
        from_mlx(module["scales"]),
        from_mlx(module["biases"]),
        module.group_size,
        module.bits,
        module.mode,
    )
    return tensor, (from_mlx(module["bias"]) if "bias" in module else None)


def replay_linear(
    x: np.ndarray,
    layer: QuantizedTensor,
    bias: np.ndarray | None = None,
    activations: Any = "float32",
    reference: np.ndarray | None = None,
    name: str = "",
) -> LinearReplay:
    """Run ``x @ W.T + bias`` fused and dequantized in ``activations``; ``reference`` is the expected output."""
    mx = mlx_core()

    dtype = numpy_dtype(activations)
    layer = layer.with_scale_dtype(dtype)
    inputs = to_mlx(np.asarray(x, dtype=np.float32).astype(dtype))
    fused = mx.quantized_matmul(
        inputs,
        to_mlx(layer.packed),
        to_mlx(layer.scales),
        to_mlx(layer.biases),
        transpose=True,
        group_size=layer.group_size,
        bits=layer.bits,
        mode=layer.mode,
    )
    dense = inputs @ to_mlx(layer.dequantize()).T
    if bias is not None:
        shift = to_mlx(np.asarray(bias).astype(dtype))
        fused, dense = fused + shift, dense + shift
    mx.eval(fused, dense)
    widen = lambda array: from_mlx(array).astype(np.float32)  # noqa: E731
    expected = None if reference is None else np.asarray(reference, dtype=np.float32)
    return LinearReplay(name, dtype.name, widen(fused), widen(dense), expected)
