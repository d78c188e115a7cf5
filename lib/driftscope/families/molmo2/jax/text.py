"""Molmo2's text decoder in JAX: pre-norm layers with q/k RMSNorm, RoPE, SwiGLU; the prefill, one decode step
against a fixed-capacity cache, and the single-stage replay functions.

The word embedding covers the base and the additional vocabulary; image features are ADDED to the
embeddings of the ``<im_patch>`` tokens. With ``mm_token_type_ids`` the prefill's mask is causal OR both
tokens are image tokens (transformers' block mask: image tokens attend to each other both ways); without it,
and for every generated token, causal. Positions are the sequence's indices. Weights are arguments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from driftscope.taps.jax.layers import Contract, linear, rms_norm

from .weights import Molmo2Spec


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos/sin [seq, head_dim] at ``positions`` ([seq])."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq
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


def _project(spec: Molmo2Spec, contract: Contract, w: dict, x: jax.Array, cos, sin):
    """Normed, rotated queries [seq, heads, hd]; keys and values [seq, kv_heads, hd] of the layer input ``x``."""
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
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _attend(spec: Molmo2Spec, contract: Contract, q, k, v, visible: jax.Array) -> jax.Array:
    """Grouped-query attention of ``q`` over ``k``, ``v`` where ``visible`` [seq, keys] allows; [seq, heads * hd]."""
    text = spec.text
    group = text.num_heads // text.num_kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (text.head_dim**-0.5)
    probs = jax.nn.softmax(jnp.where(visible[None], scores, -jnp.inf), axis=-1)
    return jnp.transpose(contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,))), (1, 0, 2)).reshape(q.shape[0], -1)


def _finish(spec: Molmo2Spec, contract: Contract, w: dict, x: jax.Array, context: jax.Array) -> jax.Array:
    """The attention's output projection and residual, then the SwiGLU MLP and its residual."""
    x = x + linear(contract, context, w["attn.o.weight"])
    h = rms_norm(x, w["post_norm.weight"], spec.text.eps)
    gate = jax.nn.silu(linear(contract, h, w["mlp.gate.weight"]))
    return x + linear(contract, gate * linear(contract, h, w["mlp.up.weight"]), w["mlp.down.weight"])


def decoder_layer(spec: Molmo2Spec, contract: Contract, w: dict, x, cos, sin, mask):
    """One layer over a whole sequence (weights without their ``text.layers.N.`` prefix): (output, keys, values)."""
    q, k, v = _project(spec, contract, w, x, cos, sin)
    return _finish(spec, contract, w, x, _attend(spec, contract, q, k, v, mask)), k, v


def layer_weights(weights: dict, layer: int) -> dict:
    prefix = f"text.layers.{layer}."
    return {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}


def _head(spec: Molmo2Spec, contract: Contract, weights: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The final norm and the logits of rows ``x``."""
    normed = rms_norm(x, weights["text.norm.weight"], spec.text.eps)
    return normed, linear(contract, normed, weights["text.lm_head.weight"])


def prefill(
    weights: dict,
    input_ids: jax.Array,
    image_features: jax.Array,
    mm_token_type_ids: jax.Array | None,
    *,
    spec: Molmo2Spec,
    contract: Contract,
    taps: tuple[str, ...] = (),
    cache: bool = False,
) -> dict[str, jax.Array]:
    """The merged embeddings (image and other slots), the mask, each layer's output (every position and the last),
    the final norm and the logits at the last position; with ``cache``, also every layer's normed, rotated keys
    and its values (``cache.keys``, ``cache.values``: [layers, seq, kv_heads, head_dim]) for :func:`decode_step`."""
    del taps  # the text stages are few and small: always returned
    seq = input_ids.shape[0]
    x, slots = merge_image_features(weights, input_ids, image_features, spec.image_patch_id)
    others = jnp.nonzero(input_ids != spec.image_patch_id, size=seq - image_features.shape[0])[0]
    mask = attention_mask(seq, mm_token_type_ids)
    out = {"text.embeds.image": x[slots], "text.embeds.text": x[others], "text.attention_mask": mask.astype(jnp.int32)}
    cos, sin = rope_tables(jnp.arange(seq), spec.text.head_dim, spec.text.rope_theta)
    keys, values = [], []
    for layer in range(spec.text.layers):
        x, k, v = decoder_layer(spec, contract, layer_weights(weights, layer), x, cos, sin, mask)
        out[f"text.layer.{layer}"], out[f"text.layer.{layer}.last"] = x, x[-1]
        keys.append(k)
        values.append(v)
    normed, logits = _head(spec, contract, weights, x[-1:])
    out["text.norm.last"], out["text.logits.last"] = normed[0], logits[0]
    if cache:
        out["cache.keys"], out["cache.values"] = jnp.stack(keys), jnp.stack(values)
    return out


def decode_step(
    weights: dict,
    keys: jax.Array,
    values: jax.Array,
    token: jax.Array,
    at: jax.Array,
    *,
    spec: Molmo2Spec,
    contract: Contract,
) -> dict[str, jax.Array]:
    """One greedy step: ``token`` ([1] int32) at sequence index and RoPE position ``at`` ([1]) attends to the ``at``
    cached positions and itself (causal: no image block past the prefill). ``keys``/``values`` [layers, capacity,
    kv_heads, head_dim] come back with the token's entries written at ``at``; one compiled graph serves every step."""
    x = jnp.take(weights["text.embed.weight"], token, axis=0).astype(jnp.float32)
    cos, sin = rope_tables(at, spec.text.head_dim, spec.text.rope_theta)
    visible = (jnp.arange(keys.shape[1]) <= at[0])[None, :]
    for layer in range(spec.text.layers):
        w = layer_weights(weights, layer)
        q, k, v = _project(spec, contract, w, x, cos, sin)
        keys = jax.lax.dynamic_update_slice(keys, k[None].astype(keys.dtype), (layer, at[0], 0, 0))
        values = jax.lax.dynamic_update_slice(values, v[None].astype(values.dtype), (layer, at[0], 0, 0))
        x = _finish(spec, contract, w, x, _attend(spec, contract, q, keys[layer], values[layer], visible))
    return {"logits": _head(spec, contract, weights, x)[1][0], "keys": keys, "values": values}


def text_replay(stage_id: str, spec: Molmo2Spec, contract: Contract, weights: dict):
    """(kind, ``f(weights, inputs, side)``, the weights it reads) of one text stage; the layers of a kind share one
    function. Sides: a layer's mask ([seq, seq] int32, 1 where allowed); the embeddings' token ids (int32)."""
    if stage_id.startswith("text.layer."):
        kind = "text.layer.last" if stage_id.endswith(".last") else "text.layer"

        def layer(w, args, side):
            x = args[0]
            cos, sin = rope_tables(jnp.arange(x.shape[0]), spec.text.head_dim, spec.text.rope_theta)
            out = decoder_layer(spec, contract, w, x, cos, sin, side[0] > 0)[0]
            return out[-1] if kind.endswith(".last") else out

        return kind, layer, layer_weights(weights, int(stage_id.split(".")[2]))
    norm, head = (
        {"text.norm.weight": weights["text.norm.weight"]},
        {"text.lm_head.weight": weights["text.lm_head.weight"]},
    )
    table = {"text.embed.weight": weights["text.embed.weight"]}
    functions = {
        "text.norm.last": (lambda w, a, side: rms_norm(a[0][None], w["text.norm.weight"], spec.text.eps)[0], norm),
        "text.logits.last": (lambda w, a, side: linear(contract, a[0][None], w["text.lm_head.weight"])[0], head),
        "text.embeds.text": (lambda w, a, side: jnp.take(w["text.embed.weight"], side[0], axis=0), table),
        "text.embeds.image": (lambda w, a, side: jnp.take(w["text.embed.weight"], side[0], axis=0) + a[0], table),
    }
    function, used = functions[stage_id]
    return stage_id, function, used
