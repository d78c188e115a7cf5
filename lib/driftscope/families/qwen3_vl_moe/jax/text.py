"""Qwen3-VL-MoE's decoder in JAX: the sparse layers' mixture of experts (spec, weights in either expert layout,
the router, the experts) and the decoder that runs them (prefill, decode step, single-layer replays)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from driftscope.model.weightfile import TensorFiles
from driftscope.taps.jax.layers import Contract, linear, rms_norm

from ....errors import CheckpointError
from ...qwen3_vl.jax.text import _project, deepstack_add, merge_embeddings, mrope_tables
from ...qwen3_vl.jax.text import text_decode_step as dense_decode_step
from ...qwen3_vl.jax.text import text_replay as dense_replay
from ...qwen3_vl.jax.weights import TextSpec, load_text_weights
from ...qwen_shared.jax_text import attend, finish, layer_weights, put_head
from ...qwen_shared.plan import layer_index
from ..held import saved_by_v5
from ..plan import moe_piece, sparse_layers, text_config

# The mixture-of-experts MLP of a Qwen3-VL-MoE sparse layer in JAX, with every stage the plan taps.
#
# The router is a linear layer; its float32 softmax's top-k picks the experts, whose weights are renormalized
# over the k (as transformers and mlx-vlm do); each expert is a SwiGLU. The choice is sorted by expert id (the
# order the plan compares). Every expert runs on every token and the chosen rows are gathered: a static graph,
# with no data-dependent shapes, that iree-compile takes as it is.


@dataclass(frozen=True)
class MoeSpec:
    """What a sparse MLP's graph depends on."""

    experts: int
    top_k: int
    hidden: int
    intermediate: int
    normalize: bool = True
    layers: tuple[int, ...] = ()
    #: whether config.json was written by transformers 5 or later: a square expert is then in its layout
    saved_by_v5: bool = True

    @classmethod
    def from_config(cls, config: dict) -> MoeSpec:
        text = text_config(config)
        return cls(
            experts=int(text.get("num_experts", text.get("num_local_experts", 0))),
            top_k=int(text["num_experts_per_tok"]),
            hidden=int(text["hidden_size"]),
            intermediate=int(text["moe_intermediate_size"]),
            normalize=bool(text.get("norm_topk_prob", True)),
            layers=tuple(sparse_layers(config)),
            saved_by_v5=saved_by_v5(config),
        )


def load_moe_weights(path: str | Path, spec: MoeSpec, layer: int) -> dict[str, np.ndarray]:
    """Layer ``layer``'s router [experts, hidden] and experts in transformers' in-memory layout (``gate_up``
    [experts, 2 x intermediate, hidden], ``down`` [experts, hidden, intermediate]), from either on-disk layout
    (the released checkpoints store both transposed; transformers 5's ``save_pretrained`` does not; a square one is
    in the layout of the transformers version that wrote config.json: ``qwen3_vl_moe.held``)."""
    files = TensorFiles(path)
    prefix = f"model.language_model.layers.{layer}.mlp."
    e, h, i = spec.experts, spec.hidden, spec.intermediate
    wanted = {
        "gate": (f"{prefix}gate.weight", (e, h), None),
        "gate_up": (f"{prefix}experts.gate_up_proj", (e, 2 * i, h), (e, h, 2 * i)),
        "down": (f"{prefix}experts.down_proj", (e, h, i), (e, i, h)),
    }
    weights = {}
    for name, (key, shape, released) in wanted.items():
        if key not in files:
            raise CheckpointError(f"checkpoint tensor {key!r} is missing", "check config.json's sparse layers")
        found = tuple(files.shape(key))
        if found not in (shape, released):
            raise CheckpointError(
                f"checkpoint tensor {key!r} has shape {list(found)}, the config implies {list(shape)}",
                "the weights and config.json disagree: re-save the checkpoint or fix the config",
            )
        value = np.asarray(files.read(key), dtype=np.float32)
        in_v5 = found == shape and (found != released or spec.saved_by_v5)
        weights[name] = value if in_v5 else np.ascontiguousarray(value.transpose(0, 2, 1))
    return weights


def route(contract: Contract, w: dict, x: jax.Array, spec: MoeSpec) -> dict[str, jax.Array]:
    """Router logits [tokens, experts], the chosen experts [tokens, top_k] (ascending id) and their weights."""
    logits = linear(contract, x, w["gate"])
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, chosen = jax.lax.top_k(probs, spec.top_k)
    if spec.normalize:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    order = jnp.argsort(chosen, axis=-1)
    return {
        "mlp.router": logits,
        "mlp.chosen": jnp.take_along_axis(chosen, order, axis=-1),
        "mlp.weights": jnp.take_along_axis(top, order, axis=-1),
    }


def expert_outputs(contract: Contract, w: dict, x: jax.Array, chosen: jax.Array, spec: MoeSpec) -> jax.Array:
    """Each chosen expert's SwiGLU output [tokens, top_k, hidden]: every expert on every token, then gathered."""
    gate_up = contract.dot(w["gate_up"], x, ((2,), (1,)))  # [experts, 2 x intermediate, tokens]
    gate, up = gate_up[:, : spec.intermediate], gate_up[:, spec.intermediate :]
    hidden = jax.nn.silu(gate) * up  # [experts, intermediate, tokens]
    every = contract.dot(w["down"], hidden, ((2,), (1,)), ((0,), (0,)))  # [experts, hidden, tokens]
    every = jnp.transpose(every, (2, 0, 1))  # [tokens, experts, hidden]
    return jnp.take_along_axis(every, chosen[:, :, None], axis=1)


def sparse_mlp(contract: Contract, w: dict, x: jax.Array, spec: MoeSpec) -> dict[str, jax.Array]:
    """Every tapped piece of one sparse MLP on its input ``x`` (the post-attention norm, [tokens, hidden])."""
    out = route(contract, w, x, spec)
    experts = expert_outputs(contract, w, x, out["mlp.chosen"], spec)
    out["mlp.experts"] = experts
    out["mlp"] = jnp.sum(experts * out["mlp.weights"][:, :, None], axis=1)
    return out


# The Qwen3-VL-MoE decoder in JAX: Qwen3-VL's emitted layers (projections, M-RoPE, attention, DeepStack adds)
# with the sparse MLP in the sparse layers, the prefill with every sparse piece as an output, a decode step, and
# the replays of the sparse pieces and of whole layers.

EXPERT_TENSORS = ("mlp.gate", "mlp.gate_up", "mlp.down")


def load_weights(path: str | Path, spec: TextSpec, moe: MoeSpec) -> dict[str, np.ndarray]:
    """Qwen3-VL's text tensors (a dense MLP only in the dense layers) and each sparse layer's router and experts
    as ``layers.N.mlp.{gate,gate_up,down}``."""
    from driftscope.model.weightfile import TensorFiles

    from ...qwen3_vl.jax.weights import TEXT_PREFIXES, _read, text_shapes

    weights = load_text_weights(path, dataclasses.replace(spec, layers=0))  # embeddings, final norm, head
    files = TensorFiles(path)
    prefix = next(p for p in TEXT_PREFIXES if f"{p}embed_tokens.weight" in files)
    sparse = set(moe.layers)
    shapes = {
        name: shape
        for name, shape in text_shapes(spec).items()
        if name.startswith("layers.") and not (int(name.split(".")[1]) in sparse and ".mlp." in name)
    }
    weights.update(_read(files, {name: prefix + name for name in shapes}, shapes, f"{spec.layers} text layers"))
    for layer in moe.layers:
        for name, value in load_moe_weights(path, moe, layer).items():
            weights[f"layers.{layer}.mlp.{name}"] = value
    return weights


def _experts(w: dict) -> dict:
    return {name.removeprefix("mlp."): w[name] for name in EXPERT_TENSORS}


def layer_pieces(spec: TextSpec, moe: MoeSpec, contract: Contract, w: dict, x, cos, sin, visible):
    """One decoder layer: (output, keys, values, the sparse pieces by suffix; {} for a dense layer)."""
    h = rms_norm(x, w["input_layernorm.weight"], spec.eps)
    q, k, v = _project(w, h, cos, sin, spec=spec, contract=contract)
    context = attend(q, k, v, visible, spec=spec, contract=contract)
    if "mlp.gate" not in w:
        return finish(w, x, context, spec=spec, contract=contract), k, v, {}
    residual = x + linear(contract, context, w["self_attn.o_proj.weight"])
    normed = rms_norm(residual, w["post_attention_layernorm.weight"], spec.eps)
    pieces = {"residual1": residual, "mlp.in": normed, **sparse_mlp(contract, _experts(w), normed, moe)}
    return residual + pieces["mlp"], k, v, pieces


def text_prefill(weights, input_ids, image_slots, image_embeds, deepstack, positions, *, spec, moe, contract, cache):
    """Qwen3-VL's prefill outputs, and every sparse layer's pieces (``text.layer.N.<piece>``)."""
    out: dict[str, jax.Array] = {}
    x = merge_embeddings(weights, input_ids, image_slots, image_embeds)
    cos, sin = mrope_tables(positions, spec)
    causal = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), dtype=bool))
    keys, values = [], []
    for i in range(spec.layers):
        x, k, v, pieces = layer_pieces(spec, moe, contract, layer_weights(weights, i), x, cos, sin, causal)
        keys.append(k)
        values.append(v)
        out.update({f"text.layer.{i}.{name}": value for name, value in pieces.items()})
        out[f"text.layer.{i}"], out[f"text.layer.{i}.last"] = x, x[-1]
        x = deepstack_add(out, i, x, image_slots, deepstack)
    return put_head(out, x[-1:], weights, (keys, values) if cache else None, spec=spec, contract=contract)


def text_decode_step(weights, keys, values, token, position, length, *, spec, moe, contract):
    """One greedy step (``qwen_shared.jax_text.decode_step``) with the sparse MLP in the sparse layers."""

    def finish_layer(w, x, context, *, spec, contract):
        if "mlp.gate" not in w:
            return finish(w, x, context, spec=spec, contract=contract)
        x = x + linear(contract, context, w["self_attn.o_proj.weight"])
        normed = rms_norm(x, w["post_attention_layernorm.weight"], spec.eps)
        return x + sparse_mlp(contract, _experts(w), normed, moe)["mlp"]

    return dense_decode_step(
        weights, keys, values, token, position, length, spec=spec, contract=contract, finish_layer=finish_layer
    )


def text_replay(stage_id: str, weights: dict, spec: TextSpec, moe: MoeSpec, contract: Contract):
    """(kind, ``function(weights, inputs, positions)``, weights): a sparse piece on its inputs, a layer with its
    sparse MLP; the rest as Qwen3-VL replays it."""
    piece = moe_piece(stage_id)
    is_layer = stage_id.startswith("text.layer.") and piece is None and not stage_id.endswith(".deepstack")
    if piece is None and not is_layer:
        return dense_replay(stage_id, weights, spec, contract)
    w = layer_weights(weights, layer_index(stage_id))
    if not is_layer:
        return f"text.moe.{piece}", _piece(piece, spec, moe, contract), w
    kind = "text.moe.layer" + next((s for s in (".last", ".image") if stage_id.endswith(s)), "")

    def layer(w, args, positions):
        cos, sin = mrope_tables(positions, spec)
        causal = jnp.tril(jnp.ones((args[0].shape[0],) * 2, dtype=bool))
        out = layer_pieces(spec, moe, contract, w, args[0], cos, sin, causal)[0]
        if kind.endswith(".last"):
            return out[-1]
        return jnp.take(out, args[1], axis=0) if kind.endswith(".image") else out

    return kind, layer, w


def _piece(piece: str, spec: TextSpec, moe: MoeSpec, contract: Contract):
    def residual(w, args, positions):
        x = args[0]
        cos, sin = mrope_tables(positions, spec)
        q, k, v = _project(
            w, rms_norm(x, w["input_layernorm.weight"], spec.eps), cos, sin, spec=spec, contract=contract
        )
        context = attend(q, k, v, jnp.tril(jnp.ones((x.shape[0],) * 2, dtype=bool)), spec=spec, contract=contract)
        return x + linear(contract, context, w["self_attn.o_proj.weight"])

    def weights_at(w, args, positions):  # the router's own softmax at the reference's choice, renormalized
        probs = jax.nn.softmax(linear(contract, args[0], w["mlp.gate"]).astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(probs, args[1], axis=-1)
        return picked / jnp.sum(picked, axis=-1, keepdims=True) if moe.normalize else picked

    return {
        "residual1": residual,
        "mlp.in": lambda w, args, p: rms_norm(args[0], w["post_attention_layernorm.weight"], spec.eps),
        "mlp.router": lambda w, args, p: route(contract, _experts(w), args[0], moe)["mlp.router"],
        "mlp.weights": weights_at,
        "mlp.experts": lambda w, args, p: expert_outputs(contract, _experts(w), args[0], args[1], moe),
        "mlp": lambda w, args, p: sparse_mlp(contract, _experts(w), args[0], moe)["mlp"],
    }[piece]
