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

from driftscope.errors import CheckpointError
from driftscope.model.weightfile import TensorFiles
from driftscope.taps.jax.layers import Contract, linear, rms_norm

from ...qwen_shared.jax_text import attend, decode_step_of, edge_replay, finish, layer_weights, put_head


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


def _decoder_layer_kv(w: dict, x: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract):
    """One causal decoder layer over a whole sequence: (output, its keys, its values)."""
    seq = x.shape[0]
    q, k, v = _project(w, rms_norm(x, w["input_layernorm.weight"], spec.eps), cos, sin, spec=spec, contract=contract)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    context = attend(q, k, v, causal, spec=spec, contract=contract)
    return finish(w, x, context, spec=spec, contract=contract), k, v


def decoder_layer(w: dict, x: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract) -> jax.Array:
    """One decoder layer over a whole sequence (weights without their ``layers.N.`` prefix), causal."""
    return _decoder_layer_kv(w, x, cos, sin, spec=spec, contract=contract)[0]


def text_prefill(
    weights: dict,
    embeds: jax.Array,
    positions: jax.Array,
    last: jax.Array | None = None,
    *,
    spec: TextSpec,
    contract: Contract,
    cache: bool = False,
) -> dict[str, jax.Array]:
    """Prefill of one sequence: each layer's output (every position and the last), the final norm and the logits
    at the last position; with ``cache``, also every layer's rotated keys and values (``cache.keys``,
    ``cache.values``: [layers, seq, kv_heads, head_dim]) for :func:`text_decode_step`. ``last`` ([1] int32), when
    given, is the prompt's last position in a sequence padded past it: attention is causal, so the positions up
    to it do not see the padding, and "last" reads that position instead of the sequence's end."""
    cos, sin = mrope_tables(positions, spec)
    out: dict[str, jax.Array] = {}
    keys, values = [], []
    x = embeds.astype(jnp.float32)

    def at_last(h):  # [1, hidden]
        return h[-1:] if last is None else jax.lax.dynamic_slice_in_dim(h, last[0], 1)

    for i in range(spec.layers):
        x, k, v = _decoder_layer_kv(layer_weights(weights, i), x, cos, sin, spec=spec, contract=contract)
        out[f"text.layer.{i}"] = x
        out[f"text.layer.{i}.last"] = at_last(x)[0]
        keys.append(k)
        values.append(v)
    return put_head(out, at_last(x), weights, (keys, values) if cache else None, spec=spec, contract=contract)


#: One greedy step against the fixed-capacity cache (``qwen_shared.jax_text.decode_step``).
text_decode_step = decode_step_of(_project, mrope_tables)


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
    return edge_replay(stage_id, weights, spec, contract)
