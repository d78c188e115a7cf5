"""What the Qwen decoders' JAX emitters share: grouped-query attention over a visibility mask, the attention
output and SwiGLU MLP with their residuals, one greedy decode step against a fixed-capacity cache, and the
replays of the stages around the layers (embeddings, final norm, head). A family brings its projections
(biases or per-head norms, which M-RoPE) as ``project(w, h, cos, sin) -> (q, k, v)`` and ``tables(positions)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from driftscope.taps.jax.layers import Contract, linear, rms_norm


def attend(q, k, v, visible, *, spec: Any, contract: Contract) -> jax.Array:
    """Grouped-query attention of ``q`` [seq, heads, d] over ``k``, ``v`` [keys, kv_heads, d] where ``visible``
    [seq, keys] allows it; the heads' contexts concatenated [seq, heads * d]."""
    group = spec.num_heads // spec.num_kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (spec.head_dim**-0.5)
    probs = jax.nn.softmax(jnp.where(visible[None], scores, -jnp.inf), axis=-1)
    return jnp.transpose(contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,))), (1, 0, 2)).reshape(q.shape[0], -1)


def finish(w: dict, x: jax.Array, context: jax.Array, *, spec: Any, contract: Contract) -> jax.Array:
    """The attention's output projection and residual, then the SwiGLU MLP and its residual."""
    x = x + linear(contract, context, w["self_attn.o_proj.weight"])
    h = rms_norm(x, w["post_attention_layernorm.weight"], spec.eps)
    gate = jax.nn.silu(linear(contract, h, w["mlp.gate_proj.weight"]))
    return x + linear(contract, gate * linear(contract, h, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])


def layer_weights(weights: dict, layer: int) -> dict:
    prefix = f"layers.{layer}."
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def put_head(out: dict, last: jax.Array, weights: dict, cache: tuple | None, *, spec: Any, contract: Contract) -> dict:
    """A prefill's outputs completed: the final norm and the logits of the ``last`` position ([1, hidden]), and with
    ``cache`` (every layer's keys and values, or None) ``cache.keys`` and ``cache.values`` stacked."""
    normed = rms_norm(last, weights["norm.weight"], spec.eps)
    out["text.norm.last"] = normed[0]
    out["text.logits.last"] = linear(contract, normed, weights["lm_head.weight"])[0]
    if cache is not None:
        out["cache.keys"], out["cache.values"] = jnp.stack(cache[0]), jnp.stack(cache[1])
    return out


def decode_step(
    weights: dict,
    keys: jax.Array,
    values: jax.Array,
    token: jax.Array,
    position: jax.Array,
    length: jax.Array,
    *,
    spec: Any,
    contract: Contract,
    project: Callable,
    tables: Callable,
    finish_layer: Callable | None = None,
) -> dict[str, jax.Array]:
    """One greedy step: ``token`` ([1] int32) at M-RoPE position ``position`` ([1], the same on t, h and w, as for
    every generated token) attends to the ``length`` ([1]) cached positions and itself. ``keys``/``values``
    [layers, capacity, kv_heads, head_dim] come back with the token's entries written at ``length``; one
    compiled graph serves every step (its shapes do not change). ``finish_layer`` (default :func:`finish`) is a
    family's own attention output and MLP, e.g. a sparse one."""
    x = jnp.take(weights["embed_tokens.weight"], token, axis=0).astype(jnp.float32)
    cos, sin = tables(jnp.broadcast_to(position[None, :], (3, 1)))
    visible = (jnp.arange(keys.shape[1]) <= length[0])[None, :]
    at = length[0]
    for i in range(spec.layers):
        w = layer_weights(weights, i)
        q, k, v = project(w, rms_norm(x, w["input_layernorm.weight"], spec.eps), cos, sin)
        keys = jax.lax.dynamic_update_slice(keys, k[None].astype(keys.dtype), (i, at, 0, 0))
        values = jax.lax.dynamic_update_slice(values, v[None].astype(values.dtype), (i, at, 0, 0))
        context = attend(q, keys[i], values[i], visible, spec=spec, contract=contract)
        x = (finish_layer or finish)(w, x, context, spec=spec, contract=contract)
    normed = rms_norm(x, weights["norm.weight"], spec.eps)
    return {"logits": linear(contract, normed, weights["lm_head.weight"])[0], "keys": keys, "values": values}


def decode_step_of(project: Callable, tables: Callable) -> Callable:
    """A family's ``text_decode_step(weights, keys, values, token, position, length, *, spec, contract,
    finish_layer=None)``: :func:`decode_step` with the family's ``project(w, h, cos, sin, *, spec, contract)`` and
    M-RoPE ``tables(positions, spec)``."""

    def text_decode_step(weights, keys, values, token, position, length, *, spec, contract, finish_layer=None):
        """One greedy step against the fixed-capacity cache (``qwen_shared.jax_text.decode_step``)."""

        def bound(w, h, cos, sin):
            return project(w, h, cos, sin, spec=spec, contract=contract)

        return decode_step(
            weights,
            keys,
            values,
            token,
            position,
            length,
            spec=spec,
            contract=contract,
            project=bound,
            tables=lambda p: tables(p, spec),
            finish_layer=finish_layer,
        )

    return text_decode_step


def edge_replay(stage_id: str, weights: dict, spec: Any, contract: Contract):
    """(kind, ``function(weights, inputs, positions)``, weights) of a stage around the layers: the final norm, the
    head, the text slots' embedding rows (inputs: their token ids), the image slots (the tower's output as it is)."""
    if stage_id == "text.norm.last":
        norm = {"norm.weight": weights["norm.weight"]}
        return stage_id, lambda w, args, p: rms_norm(args[0][None], w["norm.weight"], spec.eps)[0], norm
    if stage_id == "text.logits.last":
        head = {"lm_head.weight": weights["lm_head.weight"]}
        return stage_id, lambda w, args, p: linear(contract, args[0][None], w["lm_head.weight"])[0], head
    if stage_id == "text.embeds.text":
        table = {"embed_tokens.weight": weights["embed_tokens.weight"]}
        return stage_id, lambda w, args, p: jnp.take(w["embed_tokens.weight"], args[0], axis=0), table
    if stage_id == "text.embeds.image":
        return stage_id, lambda w, args, p: args[0], {}
    raise KeyError(stage_id)
