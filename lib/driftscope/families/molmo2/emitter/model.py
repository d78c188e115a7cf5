"""Molmo2's image path as one JAX function returning every requested stage.

Inputs are the processor's crops ([crops, patches, 588] pixel rows) and the pooling indices
([tokens, 4], -1 for padding slots; an input, not a constant, so one lowering serves every image
whose crop and token counts match). The ViT runs to the execution depth; the selected layers'
outputs are concatenated in configured order; each pooled token's query is the mean of its valid
patches and it attends over them (padding slots masked); the SwiGLU projector maps the result to
the text width. ``forward`` continues into the text decoder's prefill (see ``text``).
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp

from .config import Molmo2Spec
from .layers import Contract, gelu_tanh, layer_norm, linear, multi_head_attention, resize_positions
from .text import prefill

FINAL = "projector.output"

#: Substages of one ViT block, in execution order.
SUBSTAGES = (
    "norm1",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.context",
    "attn.out",
    "residual1",
    "norm2",
    "mlp.fc1",
    "mlp.act",
    "mlp.fc2",
)


class Taps:
    """Records the requested stages (``"*"`` records every stage)."""

    def __init__(self, wanted: Iterable[str], always: tuple[str, ...] = (FINAL,)):
        self.wanted = set(wanted) | set(always)
        self.everything = "*" in self.wanted
        self.out: dict[str, jax.Array] = {}

    def __call__(self, stage_id: str, value: jax.Array) -> jax.Array:
        if self.everything or stage_id in self.wanted:
            self.out[stage_id] = value
        return value


def _lin(contract: Contract, w: dict, name: str, x: jax.Array) -> jax.Array:
    return linear(contract, x, w[name + ".weight"], w.get(name + ".bias"))


def vit_block(spec: Molmo2Spec, contract: Contract, w: dict, x: jax.Array, tap: Taps, s: str) -> jax.Array:
    """One pre-LN ViT block over [crops, patches, hidden]; ``w`` without its ``vit.layers.N.`` prefix. Each
    operator runs under ``contract.at`` its stage (float32 where a mixed policy keeps it there)."""
    vit = spec.vit
    crops, patches, _ = x.shape
    heads = (crops, patches, vit.num_heads, vit.head_dim)

    def at(kind: str) -> Contract:
        return contract.at(s + kind)

    h = tap(s + "norm1", at("norm1").round_state(layer_norm(x, w["norm1.weight"], w["norm1.bias"], vit.eps)))
    q = tap(s + "attn.q", _lin(at("attn.q"), w, "attn.q", h).reshape(heads))
    k = tap(s + "attn.k", _lin(at("attn.k"), w, "attn.k", h).reshape(heads))
    v = tap(s + "attn.v", _lin(at("attn.v"), w, "attn.v", h).reshape(heads))
    context = tap(s + "attn.context", multi_head_attention(at("attn.context"), q, k, v))
    out = tap(s + "attn.out", _lin(at("attn.out"), w, "attn.o", context))
    x = tap(s + "residual1", at("residual1").round_state(x + out))
    h = tap(s + "norm2", at("norm2").round_state(layer_norm(x, w["norm2.weight"], w["norm2.bias"], vit.eps)))
    act = tap(s + "mlp.act", gelu_tanh(tap(s + "mlp.fc1", _lin(at("mlp.fc1"), w, "mlp.fc1", h))))
    return contract.at(s[:-1]).round_state(x + tap(s + "mlp.fc2", _lin(at("mlp.fc2"), w, "mlp.fc2", act)))


def layer_weights(weights: dict, prefix: str) -> dict:
    return {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}


def stem(spec: Molmo2Spec, contract: Contract, weights: dict, pixel_values: jax.Array, tap: Taps) -> jax.Array:
    """Patch embedding plus the learned positions (resized when a crop's grid is not the table's): block 0's input."""
    side = int(round(pixel_values.shape[1] ** 0.5))
    x = tap("vision.patch_embed", _lin(contract.at("vision.patch_embed"), weights, "vit.patch_embed", pixel_values))
    pos = tap("vision.pos_embed", resize_positions(weights["vit.pos_embed"], spec.vit.position_grid, (side, side)))
    return tap("vision.positioned", contract.at("vision.positioned").round_state(x + pos[None]))


def vit(spec: Molmo2Spec, contract: Contract, weights: dict, pixel_values: jax.Array, tap: Taps) -> list[jax.Array]:
    """The stem, then every block up to the execution depth; returns each block's output."""
    x = stem(spec, contract, weights, pixel_values, tap)
    outputs = []
    for layer in range(spec.execution_depth):
        w = layer_weights(weights, f"vit.layers.{layer}.")
        x = tap(f"vision.block.{layer}", vit_block(spec, contract, w, x, tap, f"vision.block.{layer}."))
        outputs.append(x)
    return outputs


def gather(features: jax.Array, pooling: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[rows, dim] features gathered by [tokens, slots] indices (padding slots zero), and the valid slots."""
    valid = pooling >= 0
    gathered = jnp.take(features, jnp.maximum(pooling, 0), axis=0) * valid[..., None].astype(features.dtype)
    return gathered, valid


def query(gathered: jax.Array, valid: jax.Array) -> jax.Array:
    """Each token's query: the mean of its valid patches (a token without any divides by 1)."""
    counts = valid.sum(axis=-1).astype(gathered.dtype)
    return gathered.sum(axis=1) / jnp.maximum(counts, 1)[:, None]


def attend(spec: Molmo2Spec, contract: Contract, weights: dict, q_in: jax.Array, gathered: jax.Array, valid):
    """The pooler's attention: one query per token over its patches (padding slots masked), output projection
    (every operator of it under ``contract.at("pool.output")``: a mixed policy keeps the pooler whole)."""
    adapter = spec.adapter
    tokens, slots = valid.shape
    contract = contract.at("pool.output")
    q = _lin(contract, weights, "pool.q", q_in).reshape(tokens, 1, adapter.num_heads, adapter.head_dim)
    k = _lin(contract, weights, "pool.k", gathered).reshape(tokens, slots, adapter.num_heads, adapter.head_dim)
    v = _lin(contract, weights, "pool.v", gathered).reshape(tokens, slots, adapter.num_heads, adapter.head_dim)
    return _lin(contract, weights, "pool.o", multi_head_attention(contract, q, k, v, valid)[:, 0])


def pool(spec: Molmo2Spec, contract: Contract, weights: dict, features: jax.Array, pooling: jax.Array, tap: Taps):
    """Attention pooling of [crops, patches, pool_dim] features by [tokens, slots] indices -> [tokens, hidden]."""
    gathered, valid = gather(features.reshape(-1, features.shape[-1]), pooling)
    tap("pool.valid_counts", valid.sum(axis=-1).astype(jnp.int32))
    gathered = tap("pool.gathered", gathered)  # [tokens, slots, pool_dim], padding slots zero
    q_in = tap("pool.query", query(gathered, valid))
    return tap("pool.output", attend(spec, contract, weights, q_in, gathered, valid))


def projector(contract: Contract, weights: dict, x: jax.Array, tap: Taps) -> jax.Array:
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""
    at = contract.at
    gate = tap("projector.gate", _lin(at("projector.gate"), weights, "projector.gate", x))
    act = tap("projector.act", jax.nn.silu(gate))
    product = tap("projector.product", act * tap("projector.up", _lin(at("projector.up"), weights, "projector.up", x)))
    return tap(FINAL, _lin(at(FINAL), weights, "projector.down", product))


def vision_features(
    weights: dict,
    pixel_values: jax.Array,
    pooling: jax.Array,
    *,
    spec: Molmo2Spec,
    contract: Contract,
    taps: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """ViT, selected layers, pooling and projector; returns the requested stages and ``projector.output``."""
    tap = Taps(taps)
    outputs = vit(spec, contract, weights, pixel_values, tap)
    selected = [tap(f"vision.selected.{layer}", outputs[layer]) for layer in spec.selected_layers]
    features = tap("vision.concatenated", jnp.concatenate(selected, axis=-1))
    projector(contract, weights, pool(spec, contract, weights, features, pooling, tap), tap)
    return tap.out


# Block-by-block pieces (graph: blocks): the stem, one block shared by every layer, the head.


def stem_graph(weights: dict, pixel_values, *, spec: Molmo2Spec, contract: Contract) -> dict[str, jax.Array]:
    tap = Taps(("vision.patch_embed", "vision.pos_embed", "vision.positioned"), ())
    stem(spec, contract, weights, pixel_values, tap)
    return tap.out


def block_graph(weights: dict, x, *, spec: Molmo2Spec, contract: Contract, substages: bool) -> dict[str, jax.Array]:
    """One ViT block (weights without their ``vit.layers.N.`` prefix): ``block.out`` and, if asked, its substages."""
    tap = Taps(tuple(f"block.{name}" for name in SUBSTAGES) if substages else (), ())
    tap.out["block.out"] = vit_block(spec, contract, weights, x, tap, "block.")
    return tap.out


def head_graph(weights: dict, selected, pooling, *, spec: Molmo2Spec, contract: Contract) -> dict[str, jax.Array]:
    """The selected layers concatenated, the pooler and the projector (every stage)."""
    tap = Taps(("*",))
    features = tap("vision.concatenated", jnp.concatenate(selected, axis=-1))
    projector(contract, weights, pool(spec, contract, weights, features, pooling, tap), tap)
    return tap.out


def forward(
    weights: dict,
    pixel_values: jax.Array,
    pooling: jax.Array,
    input_ids: jax.Array,
    mm_token_type_ids: jax.Array | None,
    *,
    spec: Molmo2Spec,
    contract: Contract,
    taps: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """Image path, then the text prefill with the image features added at ``<im_patch>`` slots."""
    out = vision_features(weights, pixel_values, pooling, spec=spec, contract=contract, taps=taps)
    out.update(prefill(weights, input_ids, out[FINAL], mm_token_type_ids, spec=spec, contract=contract, taps=taps))
    return out
