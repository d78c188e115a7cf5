"""MLX's affine quantization: quantize with ``mx.quantize``, dequantize in numpy bit for bit like ``mx.dequantize``.

Layout (MLX 0.32, affine mode): a ``(rows, cols)`` weight becomes ``packed`` uint32 ``(rows, cols * bits / 32)``,
value ``j`` of a word in bits ``[j * bits, (j + 1) * bits)``, and ``scales``/``biases`` ``(rows, cols / group_size)``
in the weight's dtype. Dequantization is ``q * scale + bias`` computed in the scales' dtype with a rounding after
the product and after the sum (no fused multiply-add); ``dtype`` casts that result. float16 and bfloat16
(``ml_dtypes.bfloat16``) arithmetic in numpy rounds each operation the same way, so the results are identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

#: Bit widths whose values do not straddle uint32 words (MLX packs 3, 5 and 6 bits differently).
PACKED_BITS = (2, 4, 8)
#: dtype names as policies and MLX spell them -> numpy dtypes
NUMPY_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


def numpy_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a numpy dtype, a name ("float16", "bfloat16") or an MLX dtype."""
    if isinstance(dtype, str) or type(dtype).__module__.startswith("mlx"):
        name = str(dtype).rsplit(".", 1)[-1]
        if name not in NUMPY_DTYPES:
            raise ValueError(f"no floating dtype {dtype!r} for quantized weights (use {', '.join(NUMPY_DTYPES)})")
        return NUMPY_DTYPES[name]
    return np.dtype(dtype)


@dataclass(frozen=True)
class QuantizedTensor:
    """One affine-quantized matrix as MLX stores it (``nn.QuantizedLinear``/``QuantizedEmbedding`` tensors)."""

    packed: np.ndarray  # uint32 (rows, cols * bits / 32)
    scales: np.ndarray  # (rows, cols / group_size), float32 / float16 / bfloat16
    biases: np.ndarray  # same shape and dtype as scales
    group_size: int
    bits: int
    mode: str = "affine"

    def __post_init__(self) -> None:
        check_layout(self.packed, self.scales, self.biases, self.group_size, self.bits)

    @property
    def shape(self) -> tuple[int, ...]:
        """The dense weight's shape."""
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 32 // self.bits)

    def with_scale_dtype(self, dtype: Any) -> QuantizedTensor:
        """The same codes with scales and biases cast to ``dtype`` (what ``Module.set_dtype`` does to them)."""
        dtype = numpy_dtype(dtype)
        if self.scales.dtype == dtype:
            return self
        return QuantizedTensor(
            self.packed, self.scales.astype(dtype), self.biases.astype(dtype), self.group_size, self.bits, self.mode
        )

    def dequantize(self, dtype: Any = None) -> np.ndarray:
        """The dense weight, bit-identical to ``mx.dequantize`` of these tensors (``dtype`` as there)."""
        return dequantize(self.packed, self.scales, self.biases, self.group_size, self.bits, dtype)


def check_layout(packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int, bits: int) -> None:
    """Raise ``ValueError`` naming the mismatch when the three tensors cannot be one quantized matrix."""
    if bits not in PACKED_BITS:
        raise ValueError(f"{bits}-bit codes are not supported (supported: {', '.join(map(str, PACKED_BITS))})")
    if packed.dtype != np.uint32:
        raise ValueError(f"packed codes must be uint32, got {packed.dtype}")
    if scales.shape != biases.shape or scales.dtype != biases.dtype:
        raise ValueError(f"scales {scales.shape} {scales.dtype} and biases {biases.shape} {biases.dtype} differ")
    columns = packed.shape[-1] * 32 // bits
    if scales.shape[:-1] != packed.shape[:-1] or scales.shape[-1] * group_size != columns:
        raise ValueError(
            f"packed codes {packed.shape} hold {columns} columns per row, but scales {scales.shape} "
            f"with group size {group_size} cover {scales.shape[-1] * group_size}"
        )


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """The integer codes of ``packed`` (uint32 words, least significant value first) as uint32."""
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
    codes = (packed[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_word)


def dequantize(
    packed: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int, bits: int, dtype: Any = None
) -> np.ndarray:
    """``mx.dequantize(packed, scales, biases, group_size, bits, dtype=dtype)`` in numpy, bit for bit."""
    check_layout(packed, scales, biases, group_size, bits)
    compute = scales.dtype
    codes = unpack(packed, bits).reshape(*scales.shape, group_size).astype(compute)
    product = np.multiply(codes, scales[..., None], dtype=compute)
    dense = np.add(product, biases[..., None], dtype=compute).reshape(*packed.shape[:-1], -1)
    return dense if dtype is None else dense.astype(numpy_dtype(dtype))


def mlx_core():
    """``mlx.core``, imported only after driftscope gave MLX its optimized BLAS (see ``driftscope.model.blas``)."""
    from driftscope.model.blas import mlx_blas

    mlx_blas()
    import mlx.core

    return mlx.core


def to_mlx(array: np.ndarray):
    """A numpy array (float32, float16, bfloat16, uint32) as an MLX array of the same dtype and values."""
    mx = mlx_core()

    if array.dtype == NUMPY_DTYPES["bfloat16"]:
        return mx.array(array.astype(np.float32)).astype(mx.bfloat16)  # exact: every bfloat16 is a float32
    return mx.array(array)


def from_mlx(array) -> np.ndarray:
    """An MLX array as numpy, keeping its dtype (bfloat16 as ``ml_dtypes.bfloat16``)."""
    mx = mlx_core()

    if array.dtype == mx.bfloat16:
        return np.array(array.astype(mx.float32)).astype(NUMPY_DTYPES["bfloat16"])
    return np.array(array)


def quantize(weight: np.ndarray, group_size: int, bits: int, mode: str = "affine") -> QuantizedTensor:
    """``mx.quantize`` of a dense ``(..., cols)`` weight (scales in the weight's dtype), as numpy tensors."""
    mx = mlx_core()

    packed, scales, biases = mx.quantize(
        to_mlx(np.ascontiguousarray(weight)), group_size=group_size, bits=bits, mode=mode
    )
    return QuantizedTensor(from_mlx(packed), from_mlx(scales), from_mlx(biases), group_size, bits, mode)
