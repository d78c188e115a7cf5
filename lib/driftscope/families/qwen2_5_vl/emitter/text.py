"""The Qwen2.5-VL text decoder (prefill) in JAX: M-RoPE, grouped-query causal attention, SwiGLU.

Takes the merged input embeddings and the (t, h, w) position ids, returns each layer's output and
the final norm at the last position and the last position's logits. Weights are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ....compiled.layers import Contract, linear, rms_norm
from ....errors import CheckpointError
from ....weightfile import TensorFiles


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


def decoder_layer(w: dict, x: jax.Array, cos, sin, *, spec: TextSpec, contract: Contract) -> jax.Array:
    """One decoder layer over a whole sequence (weights without their ``layers.N.`` prefix), causal."""
    seq = x.shape[0]
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    group = spec.num_heads // spec.num_kv_heads
    h = rms_norm(x, w["input_layernorm.weight"], spec.eps)
    q = linear(contract, h, w["self_attn.q_proj.weight"], w["self_attn.q_proj.bias"]).reshape(seq, spec.num_heads, -1)
    k = linear(contract, h, w["self_attn.k_proj.weight"], w["self_attn.k_proj.bias"]).reshape(
        seq, spec.num_kv_heads, -1
    )
    v = linear(contract, h, w["self_attn.v_proj.weight"], w["self_attn.v_proj.bias"]).reshape(
        seq, spec.num_kv_heads, -1
    )
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))
    scores = contract.dot(qh, kh, ((2,), (2,)), ((0,), (0,))) * (spec.head_dim**-0.5)
    probs = jax.nn.softmax(jnp.where(causal[None], scores, -jnp.inf), axis=-1)
    context = jnp.transpose(contract.dot(probs, vh, ((2,), (1,)), ((0,), (0,))), (1, 0, 2)).reshape(seq, -1)
    x = x + linear(contract, context, w["self_attn.o_proj.weight"])
    h = rms_norm(x, w["post_attention_layernorm.weight"], spec.eps)
    gate = jax.nn.silu(linear(contract, h, w["mlp.gate_proj.weight"]))
    return x + linear(contract, gate * linear(contract, h, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])


def layer_weights(weights: dict, layer: int) -> dict:
    prefix = f"layers.{layer}."
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def text_prefill(
    weights: dict, embeds: jax.Array, positions: jax.Array, *, spec: TextSpec, contract: Contract
) -> dict[str, jax.Array]:
    """Prefill of one sequence: each layer's output (every position and the last), the final norm and the logits
    at the last position."""
    cos, sin = mrope_tables(positions, spec)
    out: dict[str, jax.Array] = {}
    x = embeds.astype(jnp.float32)
    for i in range(spec.layers):
        x = decoder_layer(layer_weights(weights, i), x, cos, sin, spec=spec, contract=contract)
        out[f"text.layer.{i}"] = x
        out[f"text.layer.{i}.last"] = x[-1]
    normed = rms_norm(x[-1:], weights["norm.weight"], spec.eps)
    out["text.norm.last"] = normed[0]
    out["text.logits.last"] = linear(contract, normed, weights["lm_head.weight"])[0]
    return out


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
