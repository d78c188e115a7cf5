"""The mixture-of-experts MLP of a Qwen3-VL-MoE sparse layer in JAX, with every stage the plan taps.

The router is a linear layer; its float32 softmax's top-k picks the experts, whose weights are renormalized
over the k (as transformers and mlx-vlm do); each expert is a SwiGLU. The choice is sorted by expert id (the
order the plan compares). Every expert runs on every token and the chosen rows are gathered: a static graph,
with no data-dependent shapes, that iree-compile takes as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from driftscope.model.weightfile import TensorFiles
from driftscope.taps.jax.layers import Contract, linear

from ....errors import CheckpointError
from ..layout import saved_by_v5
from ..plan import sparse_layers, text_config


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
    in the layout of the transformers version that wrote config.json: ``qwen3_vl_moe.layout``)."""
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
