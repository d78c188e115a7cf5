"""The Qwen3-VL text decoder (prefill) in JAX: Qwen3 layers with DeepStack injection.

Qwen3 layers: RMSNorm, q/k/v projections without bias, a per-head RMSNorm on q and k (before RoPE),
interleaved M-RoPE, grouped-query causal attention, SwiGLU. DeepStack: branch k of the vision tower
is added to the hidden states at the image-token positions right after decoder layer k.

Takes the prompt's token ids, the image-token positions, the tower's merged features and its
DeepStack features, and the (t, h, w) position ids; weights are arguments. Returns
``text.layer.N.last`` (layer N's output at the last position, before any DeepStack add: the last
position is text, which the add never touches), ``text.layer.N.deepstack`` (the image-token rows
after branch N's add), ``text.layer.N.hidden`` (all rows, after the add, on request), the final
norm and the logits at the last position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .config import TextSpec
from .layers import Contract, linear, rms_norm, rotate_half


def mrope_axes(spec: TextSpec) -> np.ndarray:
    """Which position axis (0 t, 1 h, 2 w) drives each frequency: h on 1, 4, 7.., w on 2, 5, 8.. (interleaved)."""
    half = spec.head_dim // 2
    axes = np.zeros(half, dtype=np.int32)
    for axis in (1, 2):
        axes[axis : min(spec.mrope_section[axis] * 3, half) : 3] = axis
    return axes


def mrope_tables(positions: jax.Array, spec: TextSpec) -> tuple[jax.Array, jax.Array]:
    """cos/sin [seq, head_dim] from positions [3, seq] (interleaved M-RoPE, float32)."""
    half = spec.head_dim // 2
    inv_freq = 1.0 / (spec.rope_theta ** (jnp.arange(0, spec.head_dim, 2, dtype=jnp.float32) / spec.head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [3, seq, half]
    chosen = freqs[mrope_axes(spec), :, np.arange(half)].T  # [seq, half]
    full = jnp.concatenate([chosen, chosen], axis=-1)
    return jnp.cos(full), jnp.sin(full)


def _rope(x, cos, sin):
    """x: [seq, heads, head_dim]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def decoder_layer(spec: TextSpec, contract: Contract, w: dict, x, cos, sin, causal):
    """One Qwen3 decoder layer (weights without their ``layers.N.`` prefix)."""
    seq = x.shape[0]
    group = spec.num_heads // spec.num_kv_heads
    h = rms_norm(x, w["input_layernorm.weight"], spec.eps)
    q = linear(contract, h, w["self_attn.q_proj.weight"]).reshape(seq, spec.num_heads, spec.head_dim)
    k = linear(contract, h, w["self_attn.k_proj.weight"]).reshape(seq, spec.num_kv_heads, spec.head_dim)
    v = linear(contract, h, w["self_attn.v_proj.weight"]).reshape(seq, spec.num_kv_heads, spec.head_dim)
    q = _rope(rms_norm(q, w["self_attn.q_norm.weight"], spec.eps), cos, sin)
    k = _rope(rms_norm(k, w["self_attn.k_norm.weight"], spec.eps), cos, sin)
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (spec.head_dim**-0.5)
    probs = jax.nn.softmax(jnp.where(causal[None], scores, -jnp.inf), axis=-1)
    context = jnp.transpose(contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,))), (1, 0, 2)).reshape(seq, -1)
    x = x + linear(contract, context, w["self_attn.o_proj.weight"])
    h = rms_norm(x, w["post_attention_layernorm.weight"], spec.eps)
    gate = jax.nn.silu(linear(contract, h, w["mlp.gate_proj.weight"]))
    return x + linear(contract, gate * linear(contract, h, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])


def merge_embeddings(weights: dict, input_ids: jax.Array, image_slots: jax.Array, image_embeds: jax.Array):
    """Token embeddings with the tower's merged features written over the image-token rows."""
    embeds = jnp.take(weights["embed_tokens.weight"].astype(jnp.float32), input_ids, axis=0)
    return embeds.at[image_slots].set(image_embeds.astype(jnp.float32))


def text_prefill(
    weights: dict,
    input_ids: jax.Array,
    image_slots: jax.Array,
    image_embeds: jax.Array,
    deepstack: jax.Array,
    positions: jax.Array,
    *,
    spec: TextSpec,
    contract: Contract,
    taps: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """Prefill of one prompt. ``deepstack``: [branches, image tokens, hidden], in image-token order.

    Always returns every layer's ``.last``, every branch's ``.deepstack``, the final norm and logits;
    ``taps`` may add ``text.layer.N.hidden``."""
    out: dict[str, jax.Array] = {}
    x = merge_embeddings(weights, input_ids, image_slots, image_embeds)
    seq = x.shape[0]
    cos, sin = mrope_tables(positions, spec)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    for i in range(spec.layers):
        prefix = f"layers.{i}."
        w = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        x = decoder_layer(spec, contract, w, x, cos, sin, causal)
        out[f"text.layer.{i}.last"] = x[-1]
        if i < deepstack.shape[0]:
            x = x.at[image_slots].add(deepstack[i].astype(jnp.float32))
            out[f"text.layer.{i}.deepstack"] = jnp.take(x, image_slots, axis=0)
        if f"text.layer.{i}.hidden" in taps:
            out[f"text.layer.{i}.hidden"] = x
    normed = rms_norm(x[-1:], weights["norm.weight"], spec.eps)
    out["text.norm.last"] = normed[0]
    out["text.logits.last"] = linear(contract, normed, weights["lm_head.weight"])[0]
    return out
