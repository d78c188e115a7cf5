"""Molmo2's operators in JAX, honouring the precision contract (dots in ``dot_inputs``, F32 results).

LayerNorm, softmax and RoPE always run in float32. ``Contract``, ``linear`` and ``rms_norm`` are the
shared ones of the Qwen2.5-VL emitter.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from driftscope.taps.jax.layers import Contract, linear, rms_norm

__all__ = [
    "Contract",
    "bicubic_matrix",
    "gelu_tanh",
    "layer_norm",
    "linear",
    "multi_head_attention",
    "resize_positions",
    "rms_norm",
]


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(variance + eps) * weight + bias


def gelu_tanh(x: jax.Array) -> jax.Array:
    """torch's ``gelu(approximate="tanh")`` (``gelu_pytorch_tanh``)."""
    return jax.nn.gelu(x, approximate=True)


def multi_head_attention(
    contract: Contract, q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array | None = None
) -> jax.Array:
    """Softmax attention over [batch, q_rows, heads, hd] / [batch, kv_rows, heads, hd] -> [batch, q_rows, heads * hd].

    ``valid`` ([batch, kv_rows] bool) masks keys; a fully masked row attends uniformly (as transformers'
    additive minimum does) instead of producing NaN.
    """
    batch, rows, heads, head_dim = q.shape
    qh, kh, vh = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # [batch, heads, rows, hd]
    scores = contract.dot(qh, kh, ((3,), (3,)), ((0, 1), (0, 1))) * (head_dim**-0.5)
    if valid is not None:
        scores = jnp.where(valid[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    context = contract.dot(probs, vh, ((3,), (2,)), ((0, 1), (0, 1)))  # [batch, heads, rows, hd]
    return jnp.transpose(context, (0, 2, 1, 3)).reshape(batch, rows, heads * head_dim)


def _cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution kernel (torch's bicubic, A = -0.75)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


@functools.cache
def bicubic_matrix(source: int, target: int) -> np.ndarray:
    """[target, source] weights of torch's ``interpolate(mode="bicubic", align_corners=False)`` on one axis.

    Sample ``i`` reads ``(i + 0.5) * source / target - 0.5``; its four taps clamp at the border.
    """
    out = np.zeros((target, source), dtype=np.float64)
    for i in range(target):
        x = (i + 0.5) * source / target - 0.5
        base = int(np.floor(x))
        for tap in range(base - 1, base + 3):
            out[i, min(max(tap, 0), source - 1)] += _cubic(np.array(x - tap))
    return out.astype(np.float32)


def resize_positions(table: jax.Array, grid: int, target: tuple[int, int]) -> jax.Array:
    """The learned [grid * grid, hidden] position table resized bicubically to ``target`` (rows, cols).

    Identity (no arithmetic) when the grids agree, which is always the case for 378-px crops.
    """
    if target == (grid, grid):
        return table
    rows, cols = bicubic_matrix(grid, target[0]), bicubic_matrix(grid, target[1])
    square = table.reshape(grid, grid, -1)
    resized = jnp.einsum("ry,yxc,sx->rsc", rows, square, cols, precision=jax.lax.Precision.HIGHEST)
    return resized.reshape(target[0] * target[1], -1)
