"""The tower's operators in JAX, each honouring the precision contract.

``Contract`` says which dtype feeds every dot/convolution (results are always float32) and which
dtype the residual stream and norm results are rounded through. Normalization, softmax and RoPE
always run in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from driftscope.taps.jax.contract import Contract  # re-exported: the operators below take it


def linear(contract: Contract, x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """``x @ weight.T + bias`` (torch layout: weight is [out, in])."""
    y = contract.dot(x, weight, ((x.ndim - 1,), (1,)))
    return y if bias is None else y + bias


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    variance = jnp.mean(x * x, axis=-1, keepdims=True)
    return weight * (x * jax.lax.rsqrt(variance + eps))


def patch_embed(contract: Contract, pixels: jax.Array, weight: jax.Array) -> jax.Array:
    """The Conv3d patch embedding: stride equals kernel, so it is one dot over the flattened patch."""
    return contract.dot(pixels, weight.reshape(weight.shape[0], -1), ((1,), (1,)))


def rotary_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """Axial RoPE: h and w angles, each over head_dim/4 frequencies, laid out [h, w, h, w]."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, spatial, 2, dtype=jnp.float32) / spatial))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [rows, 2, head_dim/4]
    hw = jnp.concatenate([angles[:, 0], angles[:, 1]], axis=-1)
    full = jnp.concatenate([hw, hw], axis=-1)
    return jnp.cos(full), jnp.sin(full)


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [rows, heads, head_dim]; tables: [rows, head_dim]; float32 throughout."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + rotate_half(x) * sin


def segment_mask(segments: jax.Array) -> jax.Array:
    """[rows, rows] True where query and key share a segment (padding rows: only themselves)."""
    return segments[:, None] == segments[None, :]


def attention(contract: Contract, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked softmax attention over [rows, heads, head_dim] -> [rows, heads * head_dim]; softmax in float32."""
    rows, heads, head_dim = q.shape
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))  # [heads, rows, head_dim]
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (head_dim**-0.5)  # [heads, rows, rows]
    scores = jnp.where(mask[None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    context = contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,)))  # [heads, rows, head_dim]
    return jnp.transpose(context, (1, 0, 2)).reshape(rows, heads * head_dim)
