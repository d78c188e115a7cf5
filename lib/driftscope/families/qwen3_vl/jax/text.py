"""The Qwen3-VL text decoder in JAX: Qwen3 layers with DeepStack injection, the prefill and a decode step.

Qwen3 layers: RMSNorm, q/k/v projections without bias, a per-head RMSNorm on q and k (before RoPE),
interleaved M-RoPE, grouped-query causal attention, SwiGLU. DeepStack: branch k of the vision tower
is added to the hidden states at the image-token positions right after decoder layer k.

The prefill takes the prompt's token ids, the image-token positions, the tower's merged features and
its DeepStack features, and the (t, h, w) position ids; weights are arguments. It returns
``text.layer.N`` (layer N's own output, every position, before any DeepStack add), its last position
(``.last``: a text slot, which the add never touches), its image rows before and after branch N's add
(``.image``, ``.deepstack``), the final norm and the logits at the last position. A decode step runs
one token against a fixed-capacity cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...qwen_shared.jax_text import attend, decode_step_of, edge_replay, finish, layer_weights, put_head
from ...qwen_shared.plan import layer_index
from .model import Contract, linear, rms_norm, rotate_half
from .weights import TextSpec


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


def _project(w: dict, h: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract):
    """Queries [seq, heads, head_dim] and keys, values [seq, kv_heads, head_dim] of normed ``h``: q and k each
    RMS-normed per head, then rotated."""
    seq = h.shape[0]
    q = linear(contract, h, w["self_attn.q_proj.weight"]).reshape(seq, spec.num_heads, spec.head_dim)
    k = linear(contract, h, w["self_attn.k_proj.weight"]).reshape(seq, spec.num_kv_heads, spec.head_dim)
    v = linear(contract, h, w["self_attn.v_proj.weight"]).reshape(seq, spec.num_kv_heads, spec.head_dim)
    q = _rope(rms_norm(q, w["self_attn.q_norm.weight"], spec.eps), cos, sin)
    k = _rope(rms_norm(k, w["self_attn.k_norm.weight"], spec.eps), cos, sin)
    return q, k, v


def decoder_layer_kv(spec: TextSpec, contract: Contract, w: dict, x, cos, sin, causal):
    """One Qwen3 decoder layer (weights without their ``layers.N.`` prefix): (output, its keys, its values)."""
    h = rms_norm(x, w["input_layernorm.weight"], spec.eps)
    q, k, v = _project(w, h, cos, sin, spec=spec, contract=contract)
    context = attend(q, k, v, causal, spec=spec, contract=contract)
    return finish(w, x, context, spec=spec, contract=contract), k, v


def decoder_layer(spec: TextSpec, contract: Contract, w: dict, x, cos, sin, causal):
    """One Qwen3 decoder layer (weights without their ``layers.N.`` prefix)."""
    return decoder_layer_kv(spec, contract, w, x, cos, sin, causal)[0]


def merge_embeddings(weights: dict, input_ids: jax.Array, image_slots: jax.Array, image_embeds: jax.Array):
    """Token embeddings with the tower's merged features written over the image-token rows."""
    embeds = jnp.take(weights["embed_tokens.weight"].astype(jnp.float32), input_ids, axis=0)
    return embeds.at[image_slots].set(image_embeds.astype(jnp.float32))


def deepstack_add(out: dict, layer: int, x: jax.Array, image_slots: jax.Array, deepstack: jax.Array) -> jax.Array:
    """``x`` after ``layer``'s DeepStack add (none past the branches): the image rows before it (``.image``) and
    after it (``.deepstack``) go into ``out``."""
    if layer >= deepstack.shape[0]:
        return x
    out[f"text.layer.{layer}.image"] = jnp.take(x, image_slots, axis=0)
    x = x.at[image_slots].add(deepstack[layer].astype(jnp.float32))
    out[f"text.layer.{layer}.deepstack"] = jnp.take(x, image_slots, axis=0)
    return x


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
    cache: bool = False,
) -> dict[str, jax.Array]:
    """Prefill of one prompt. ``deepstack``: [branches, image tokens, hidden], in image-token order.

    Returns every layer's output (every position and the last; for a layer followed by an add, the image rows
    before it, ``.image``, and after it, ``.deepstack``), the final norm and logits; with ``cache``, also every
    layer's rotated keys and values (``cache.keys``, ``cache.values``: [layers, seq, kv_heads, head_dim])."""
    out: dict[str, jax.Array] = {}
    x = merge_embeddings(weights, input_ids, image_slots, image_embeds)
    seq = x.shape[0]
    cos, sin = mrope_tables(positions, spec)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    keys, values = [], []
    for i in range(spec.layers):
        x, k, v = decoder_layer_kv(spec, contract, layer_weights(weights, i), x, cos, sin, causal)
        keys.append(k)
        values.append(v)
        out[f"text.layer.{i}"] = x
        out[f"text.layer.{i}.last"] = x[-1]
        x = deepstack_add(out, i, x, image_slots, deepstack)
    return put_head(out, x[-1:], weights, (keys, values) if cache else None, spec=spec, contract=contract)


#: One greedy step against the fixed-capacity cache (``qwen_shared.jax_text.decode_step``); a generated token is
#: text, so no DeepStack add.
text_decode_step = decode_step_of(_project, mrope_tables)


def text_replay(stage_id: str, weights: dict, spec: TextSpec, contract: Contract):
    """(kind, ``function(weights, inputs, positions)``, weights) of one text stage's replay; the layers of a kind
    share one function (weights without their prefix). A layer's ``.image`` reads its input sequence and the
    image slots' indices; ``.deepstack`` the layer's image rows and the branch's features."""
    if stage_id.endswith(".deepstack"):
        return "text.deepstack", lambda w, args, p: args[0] + args[1], {}
    if stage_id.startswith("text.layer."):
        kind = "text.layer" + next((s for s in (".last", ".image") if stage_id.endswith(s)), "")

        def layer(w, args, positions):
            cos, sin = mrope_tables(positions, spec)
            seq = args[0].shape[0]
            out = decoder_layer(spec, contract, w, args[0], cos, sin, jnp.tril(jnp.ones((seq, seq), dtype=bool)))
            if kind.endswith(".last"):
                return out[-1]
            return jnp.take(out, args[1], axis=0) if kind.endswith(".image") else out

        return kind, layer, layer_weights(weights, layer_index(stage_id))
    return edge_replay(stage_id, weights, spec, contract)
