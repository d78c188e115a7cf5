"""Qwen3-VL's operators in JAX, each honouring the precision contract.

The contract, linear layers, RMSNorm, axial RoPE and masked attention are the shared ones
(``driftscope.taps.jax.layers``). What Qwen3-VL adds: LayerNorm with centered variance, the patch
embedding's bias, the interpolated position table, GELU in both forms. Normalization, softmax, RoPE
and the position interpolation always run in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from driftscope.taps.jax.layers import (
    Contract,
    apply_rope,
    attention,
    linear,
    rms_norm,
    rotary_tables,
    rotate_half,
    segment_mask,
)

__all__ = [
    "Contract",
    "apply_rope",
    "attention",
    "gelu",
    "interpolate_pos_embed",
    "layer_norm",
    "linear",
    "patch_embed",
    "rms_norm",
    "rotary_tables",
    "rotate_half",
    "segment_mask",
]


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis: mean removed, then the (biased) variance of the centered values."""
    x = x.astype(jnp.float32)
    centered = x - jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(variance + eps) * weight + bias


def gelu(x: jax.Array, tanh: bool) -> jax.Array:
    """GELU: the tanh approximation (``gelu_pytorch_tanh``) or the exact erf form (``nn.GELU()``)."""
    return jax.nn.gelu(x, approximate=tanh)


def patch_embed(contract: Contract, pixels: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    """The Conv3d patch embedding (stride equals kernel): one dot over the flattened patch, plus bias."""
    return contract.dot(pixels, weight.reshape(weight.shape[0], -1), ((1,), (1,))) + bias


def interpolate_pos_embed(table: jax.Array, indices: jax.Array, weights: jax.Array) -> jax.Array:
    """Bilinear resampling of the learned table: each row is the weighted sum of its 4 table rows (float32)."""
    rows = jnp.take(table.astype(jnp.float32), indices, axis=0)  # [patches, 4, hidden]
    return jnp.sum(rows * weights[:, :, None].astype(jnp.float32), axis=1)
