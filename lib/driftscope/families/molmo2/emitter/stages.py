"""Single-stage functions for same-input replay, one per stage kind.

Each is ``f(weights, inputs, side)``: the stage's weights (a ViT block's without their ``vit.layers.N.``
prefix, so every block of a kind shares one function, one lowering and one compiled artifact), its input
stages, and side arrays from the replay context (pooling indices, token types). Integer side arrays are int32.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..plan import parse_stage
from .config import Molmo2Spec
from .layers import Contract, gelu_tanh, layer_norm, multi_head_attention
from .model import SUBSTAGES, Taps, _lin, attend, gather, layer_weights, query, resize_positions, vit_block
from .text import attention_mask


def substage_function(kind: str, spec: Molmo2Spec, contract: Contract) -> Callable:
    """``f(weights, *inputs) -> array`` for one ViT block stage kind (weights without the layer prefix)."""
    vit = spec.vit

    def heads(x):
        return x.reshape(*x.shape[:-1], vit.num_heads, vit.head_dim)

    functions: dict[str, Callable] = {
        "block": lambda w, x: vit_block(spec, contract, w, x, Taps((), ()), ""),
        "norm1": lambda w, x: contract.round_state(layer_norm(x, w["norm1.weight"], w["norm1.bias"], vit.eps)),
        "attn.q": lambda w, h: heads(_lin(contract, w, "attn.q", h)),
        "attn.k": lambda w, h: heads(_lin(contract, w, "attn.k", h)),
        "attn.v": lambda w, h: heads(_lin(contract, w, "attn.v", h)),
        "attn.context": lambda w, q, k, v: multi_head_attention(contract, q, k, v),
        "attn.out": lambda w, context: _lin(contract, w, "attn.o", context),
        "residual1": lambda w, x, out: contract.round_state(x + out),
        "norm2": lambda w, x: contract.round_state(layer_norm(x, w["norm2.weight"], w["norm2.bias"], vit.eps)),
        "mlp.fc1": lambda w, h: _lin(contract, w, "mlp.fc1", h),
        "mlp.act": lambda w, x: gelu_tanh(x),
        "mlp.fc2": lambda w, act: _lin(contract, w, "mlp.fc2", act),
    }
    return functions[kind]


def _positioned(spec: Molmo2Spec, contract: Contract):
    def positioned(w, x):
        side = int(round(x.shape[1] ** 0.5))
        return contract.round_state(
            x + resize_positions(w["vit.pos_embed"], spec.vit.position_grid, (side, side))[None]
        )

    return positioned


def _head(stage_id: str, spec: Molmo2Spec, contract: Contract) -> Callable:
    """``f(weights, inputs, side)`` of a stage after the ViT."""

    def pool_query(w, a, side):
        gathered, valid = gather(a[0].reshape(-1, a[0].shape[-1]), side[0])
        return query(gathered, valid)

    functions: dict[str, Callable] = {
        "vision.patch_embed": lambda w, a, side: _lin(contract, w, "vit.patch_embed", a[0]),
        "vision.positioned": lambda w, a, side: _positioned(spec, contract)(w, a[0]),
        "vision.concatenated": lambda w, a, side: jnp.concatenate(a, axis=-1),
        "pool.gathered": lambda w, a, side: gather(a[0].reshape(-1, a[0].shape[-1]), side[0])[0],
        "pool.query": pool_query,
        "pool.output": lambda w, a, side: attend(spec, contract, w, a[0], a[1], side[0] >= 0),
        "projector.gate": lambda w, a, side: _lin(contract, w, "projector.gate", a[0]),
        "projector.act": lambda w, a, side: jax.nn.silu(a[0]),
        "projector.up": lambda w, a, side: _lin(contract, w, "projector.up", a[0]),
        "projector.product": lambda w, a, side: a[0] * a[1],
        "projector.output": lambda w, a, side: _lin(contract, w, "projector.down", a[0]),
        "text.attention_mask": lambda w, a, side: attention_mask(a[1].shape[0], a[1]).astype(jnp.int32),
    }
    return functions[stage_id]


#: Weight name prefixes each stage after the ViT reads.
_HEAD_WEIGHTS = {
    "vision.patch_embed": ("vit.patch_embed.",),
    "vision.positioned": ("vit.pos_embed",),
    "pool.output": ("pool.",),
    "projector.gate": ("projector.gate.",),
    "projector.up": ("projector.up.",),
    "projector.output": ("projector.down.",),
}


def replay_function(stage_id: str, spec: Molmo2Spec, contract: Contract, weights: dict, inputs: list, ctx):
    """(kind, ``f(weights, inputs, side)``, (weights, inputs, side)) of one stage, for the compiled runtimes."""
    block, kind = parse_stage(stage_id)
    floats = tuple(np.asarray(x, dtype=np.float32) for x in inputs)
    if block is not None:
        function = substage_function(kind, spec, contract)
        return kind, lambda w, a, side: function(w, *a), (layer_weights(weights, f"vit.layers.{block}."), floats, ())
    if stage_id.startswith("vision.selected."):  # the emitter's own choice of layer for this slot
        slot = ctx.slot(int(stage_id.rsplit(".", 1)[1]))
        layer = spec.selected_layers[slot]
        return f"selected.{slot}", lambda w, a, side: a[layer], ({}, floats, ())
    prefixes = _HEAD_WEIGHTS.get(stage_id, ())
    used = {name: value for name, value in weights.items() if name.startswith(prefixes)} if prefixes else {}
    side: tuple = ()
    if stage_id == "pool.gathered":
        side = (ctx.pooling.astype(np.int32),)
    elif stage_id in ("pool.query", "pool.output"):
        side = (ctx.flat_pooling().astype(np.int32),)
    if stage_id == "text.attention_mask":
        floats = tuple(np.asarray(x, dtype=np.int32) for x in inputs)
    return stage_id, _head(stage_id, spec, contract), (used, floats, side)


__all__ = ["SUBSTAGES", "replay_function", "substage_function"]
