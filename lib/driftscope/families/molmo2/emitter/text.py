"""Molmo2's text decoder (prefill) in JAX: pre-norm layers with per-head q/k RMSNorm, RoPE, SwiGLU.

The word embedding covers the base and the additional vocabulary; image features are ADDED to the
embeddings of the ``<im_patch>`` tokens. With ``mm_token_type_ids`` the mask is causal OR both
tokens are image tokens (transformers' block mask: image tokens attend to each other both ways);
without it, causal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .config import Molmo2Spec
from .layers import Contract, linear, rms_norm


def rope_tables(seq: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq
    full = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(full), jnp.sin(full)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def attention_mask(seq: int, mm_token_type_ids: jax.Array | None) -> jax.Array:
    """[seq, seq] True where query row may read key column."""
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    if mm_token_type_ids is None:
        return mask
    image = mm_token_type_ids == 1
    return mask | (image[:, None] & image[None, :])


def merge_image_features(
    weights: dict, input_ids: jax.Array, features: jax.Array, patch_id: int
) -> tuple[jax.Array, jax.Array]:
    """Token embeddings with ``features`` added at the ``<im_patch>`` slots, in order; and those slots."""
    embeds = jnp.take(weights["text.embed.weight"], input_ids, axis=0)
    slots = jnp.nonzero(input_ids == patch_id, size=features.shape[0])[0]
    return embeds.at[slots].add(features), slots


def _layer(spec: Molmo2Spec, contract: Contract, w: dict, x, cos, sin, mask):
    text = spec.text
    seq = x.shape[0]
    h = rms_norm(x, w["input_norm.weight"], text.eps)
    q = linear(contract, h, w["attn.q.weight"], w.get("attn.q.bias"))
    k = linear(contract, h, w["attn.k.weight"], w.get("attn.k.bias"))
    v = linear(contract, h, w["attn.v.weight"], w.get("attn.v.bias")).reshape(seq, text.num_kv_heads, -1)
    if text.qk_norm_type == "olmo":
        q, k = rms_norm(q, w["attn.q_norm.weight"], text.eps), rms_norm(k, w["attn.k_norm.weight"], text.eps)
    q, k = q.reshape(seq, text.num_heads, -1), k.reshape(seq, text.num_kv_heads, -1)
    if text.qk_norm_type == "qwen3":
        q, k = rms_norm(q, w["attn.q_norm.weight"], text.eps), rms_norm(k, w["attn.k_norm.weight"], text.eps)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    group = text.num_heads // text.num_kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (text.head_dim**-0.5)
    probs = jax.nn.softmax(jnp.where(mask[None], scores, -jnp.inf), axis=-1)
    context = jnp.transpose(contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,))), (1, 0, 2)).reshape(seq, -1)
    x = x + linear(contract, context, w["attn.o.weight"])
    h = rms_norm(x, w["post_norm.weight"], text.eps)
    gate = jax.nn.silu(linear(contract, h, w["mlp.gate.weight"]))
    return x + linear(contract, gate * linear(contract, h, w["mlp.up.weight"]), w["mlp.down.weight"])


def prefill(
    weights: dict,
    input_ids: jax.Array,
    image_features: jax.Array,
    mm_token_type_ids: jax.Array | None,
    *,
    spec: Molmo2Spec,
    contract: Contract,
    taps: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """The merged embeddings (image and other slots), the mask, each layer's last position, the final norm and
    the logits at the last position."""
    del taps  # the text stages are few and small: always returned
    seq = input_ids.shape[0]
    x, slots = merge_image_features(weights, input_ids, image_features, spec.image_patch_id)
    others = jnp.nonzero(input_ids != spec.image_patch_id, size=seq - image_features.shape[0])[0]
    mask = attention_mask(seq, mm_token_type_ids)
    out = {"text.embeds.image": x[slots], "text.embeds.text": x[others], "text.attention_mask": mask.astype(jnp.int32)}
    cos, sin = rope_tables(seq, spec.text.head_dim, spec.text.rope_theta)
    for layer in range(spec.text.layers):
        prefix = f"text.layers.{layer}."
        w = {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}
        x = _layer(spec, contract, w, x, cos, sin, mask)
        out[f"text.layer.{layer}.last"] = x[-1]
    normed = rms_norm(x[-1:], weights["text.norm.weight"], spec.text.eps)
    out["text.norm.last"] = normed[0]
    out["text.logits.last"] = linear(contract, normed, weights["text.lm_head.weight"])[0]
    return out
