"""The Qwen2.5-VL text decoder in JAX: M-RoPE, grouped-query causal attention, SwiGLU.

The prefill takes the merged input embeddings and the (t, h, w) position ids and returns each layer's
output, the final norm at the last position and the last position's logits (and, for decoding, every
layer's keys and values); a decode step runs one token against a fixed-size cache. Weights are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from driftscope.model.weightfile import TensorFiles
from driftscope.taps.jax.layers import Contract, linear, rms_norm

from ....errors import CheckpointError


@dataclass(frozen=True)
class TextSpec:
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    mrope_section: tuple[int, ...]
    eps: float
    tie_word_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_config(cls, config: dict) -> TextSpec:
        text = dict(config.get("text_config") or config)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        return cls(
            layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            num_heads=int(text["num_attention_heads"]),
            num_kv_heads=int(text["num_key_value_heads"]),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 1e6))),
            mrope_section=tuple(int(s) for s in rope.get("mrope_section", (16, 24, 24))),
            eps=float(text.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        )


def load_text_weights(path, spec: TextSpec) -> dict[str, np.ndarray]:
    """Text tensors keyed without their prefix (``embed_tokens.weight``, ``layers.0.self_attn.q_proj.weight``...)."""
    files = TensorFiles(path)
    prefix = next((p for p in ("model.language_model.", "model.") if f"{p}embed_tokens.weight" in files), None)
    if prefix is None:
        raise CheckpointError(
            f"checkpoint {path} has no text embedding (model.embed_tokens.weight)",
            "use a full Qwen2.5-VL checkpoint to follow the prompt past the vision tower",
        )
    names = ["embed_tokens.weight", "norm.weight"] + [
        f"layers.{i}.{name}"
        for i in range(spec.layers)
        for name in (
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.q_proj.bias",
            "self_attn.k_proj.weight",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.weight",
            "self_attn.v_proj.bias",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        )
    ]
    keys = {name: prefix + name for name in names}
    if not spec.tie_word_embeddings:
        keys["lm_head.weight"] = "lm_head.weight"
    weights = {}
    for name, key in keys.items():
        if key not in files:
            raise CheckpointError(f"checkpoint tensor {key!r} is missing", "re-save the checkpoint or fix its config")
        weights[name] = files.read(key)
    if spec.tie_word_embeddings:  # one array in memory (and on the device), as the tied model has one tensor
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    return weights


def mrope_tables(positions: jax.Array, spec: TextSpec) -> tuple[jax.Array, jax.Array]:
    """cos/sin [seq, head_dim]: frequency chunk i of ``mrope_section`` takes axis i % 3 (t, h, w)."""
    inv_freq = 1.0 / (spec.rope_theta ** (jnp.arange(0, spec.head_dim, 2, dtype=jnp.float32) / spec.head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [3, seq, head_dim/2]
    bounds = np.cumsum((0,) + spec.mrope_section)
    chunks = [freqs[i % 3, :, int(a) : int(b)] for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]
    half = jnp.concatenate(chunks, axis=-1)
    full = jnp.concatenate([half, half], axis=-1)
    return jnp.cos(full), jnp.sin(full)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _project(w: dict, h: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract):
    """Rotated queries [seq, heads, head_dim] and keys, values [seq, kv_heads, head_dim] of normed ``h``."""
    seq = h.shape[0]
    q = linear(contract, h, w["self_attn.q_proj.weight"], w["self_attn.q_proj.bias"]).reshape(seq, spec.num_heads, -1)
    k = linear(contract, h, w["self_attn.k_proj.weight"], w["self_attn.k_proj.bias"]).reshape(
        seq, spec.num_kv_heads, -1
    )
    v = linear(contract, h, w["self_attn.v_proj.weight"], w["self_attn.v_proj.bias"]).reshape(
        seq, spec.num_kv_heads, -1
    )
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _attend(q, k, v, visible, *, spec: TextSpec, contract: Contract) -> jax.Array:
    """Grouped-query attention of ``q`` [seq, heads, d] over ``k``, ``v`` [keys, kv_heads, d] where ``visible``
    [seq, keys] allows it; the heads' contexts concatenated [seq, heads * d]."""
    group = spec.num_heads // spec.num_kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (spec.head_dim**-0.5)
    probs = jax.nn.softmax(jnp.where(visible[None], scores, -jnp.inf), axis=-1)
    return jnp.transpose(contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,))), (1, 0, 2)).reshape(q.shape[0], -1)


def _finish(w: dict, x: jax.Array, context: jax.Array, *, spec: TextSpec, contract: Contract) -> jax.Array:
    """The attention's output projection and residual, then the SwiGLU MLP and its residual."""
    x = x + linear(contract, context, w["self_attn.o_proj.weight"])
    h = rms_norm(x, w["post_attention_layernorm.weight"], spec.eps)
    gate = jax.nn.silu(linear(contract, h, w["mlp.gate_proj.weight"]))
    return x + linear(contract, gate * linear(contract, h, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])


def _decoder_layer_kv(w: dict, x: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract):
    """One causal decoder layer over a whole sequence: (output, its keys, its values)."""
    seq = x.shape[0]
    q, k, v = _project(w, rms_norm(x, w["input_layernorm.weight"], spec.eps), cos, sin, spec=spec, contract=contract)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    context = _attend(q, k, v, causal, spec=spec, contract=contract)
    return _finish(w, x, context, spec=spec, contract=contract), k, v


def decoder_layer(w: dict, x: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract) -> jax.Array:
    """One decoder layer over a whole sequence (weights without their ``layers.N.`` prefix), causal."""
    return _decoder_layer_kv(w, x, cos, sin, spec=spec, contract=contract)[0]


def layer_weights(weights: dict, layer: int) -> dict:
    prefix = f"layers.{layer}."
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def text_prefill(
    weights: dict, embeds: jax.Array, positions: jax.Array, *, spec: TextSpec, contract: Contract, cache: bool = False
) -> dict[str, jax.Array]:
    """Prefill of one sequence: each layer's output (every position and the last), the final norm and the logits
    at the last position; with ``cache``, also every layer's rotated keys and values (``cache.keys``,
    ``cache.values``: [layers, seq, kv_heads, head_dim]) for :func:`text_decode_step`."""
    cos, sin = mrope_tables(positions, spec)
    out: dict[str, jax.Array] = {}
    keys, values = [], []
    x = embeds.astype(jnp.float32)
    for i in range(spec.layers):
        x, k, v = _decoder_layer_kv(layer_weights(weights, i), x, cos, sin, spec=spec, contract=contract)
        out[f"text.layer.{i}"] = x
        out[f"text.layer.{i}.last"] = x[-1]
        keys.append(k)
        values.append(v)
    normed = rms_norm(x[-1:], weights["norm.weight"], spec.eps)
    out["text.norm.last"] = normed[0]
    out["text.logits.last"] = linear(contract, normed, weights["lm_head.weight"])[0]
    if cache:
        out["cache.keys"], out["cache.values"] = jnp.stack(keys), jnp.stack(values)
    return out


def text_decode_step(
    weights: dict,
    keys: jax.Array,
    values: jax.Array,
    token: jax.Array,
    position: jax.Array,
    length: jax.Array,
    *,
    spec: TextSpec,
    contract: Contract,
) -> dict[str, jax.Array]:
    """One greedy step: ``token`` ([1] int32) at M-RoPE position ``position`` ([1], the same on t, h and w, as for
    every generated token) attends to the ``length`` ([1]) cached positions and itself. ``keys``/``values``
    [layers, capacity, kv_heads, head_dim] come back with the token's entries written at ``length``; one
    compiled graph serves every step (its shapes do not change)."""
    x = jnp.take(weights["embed_tokens.weight"], token, axis=0).astype(jnp.float32)
    cos, sin = mrope_tables(jnp.broadcast_to(position[None, :], (3, 1)), spec)
    visible = (jnp.arange(keys.shape[1]) <= length[0])[None, :]
    at = length[0]
    for i in range(spec.layers):
        w = layer_weights(weights, i)
        q, k, v = _project(
            w, rms_norm(x, w["input_layernorm.weight"], spec.eps), cos, sin, spec=spec, contract=contract
        )
        keys = jax.lax.dynamic_update_slice(keys, k[None].astype(keys.dtype), (i, at, 0, 0))
        values = jax.lax.dynamic_update_slice(values, v[None].astype(values.dtype), (i, at, 0, 0))
        context = _attend(q, keys[i], values[i], visible, spec=spec, contract=contract)
        x = _finish(w, x, context, spec=spec, contract=contract)
    normed = rms_norm(x, weights["norm.weight"], spec.eps)
    return {"logits": linear(contract, normed, weights["lm_head.weight"])[0], "keys": keys, "values": values}


def text_replay(stage_id: str, weights: dict, spec: TextSpec, contract: Contract):
    """(kind, function, weights) of one text stage's replay: ``function(weights, inputs, positions)``; the layers
    of a kind share one function (weights without their prefix)."""
    if stage_id.startswith("text.layer."):
        kind = "text.layer.last" if stage_id.endswith(".last") else "text.layer"

        def layer(w, args, positions):
            cos, sin = mrope_tables(positions, spec)
            out = decoder_layer(w, args[0], cos, sin, spec=spec, contract=contract)
            return out[-1] if kind.endswith(".last") else out

        return kind, layer, layer_weights(weights, int(stage_id.split(".")[2]))
    if stage_id == "text.norm.last":
        norm = {"norm.weight": weights["norm.weight"]}
        return stage_id, lambda w, args, p: rms_norm(args[0][None], w["norm.weight"], spec.eps)[0], norm
    if stage_id == "text.logits.last":
        head = {"lm_head.weight": weights["lm_head.weight"]}
        return stage_id, lambda w, args, p: linear(contract, args[0][None], w["lm_head.weight"])[0], head
    if stage_id == "text.embeds.text":  # the embedding rows of the prompt's text slots (args: their token ids)
        table = {"embed_tokens.weight": weights["embed_tokens.weight"]}
        return stage_id, lambda w, args, p: jnp.take(w["embed_tokens.weight"], args[0], axis=0), table
    if stage_id == "text.embeds.image":  # the tower's output written into the image slots as it is
        return stage_id, lambda w, args, p: args[0], {}
    raise KeyError(stage_id)
