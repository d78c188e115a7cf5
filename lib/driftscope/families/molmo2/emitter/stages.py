"""Single-stage functions for same-input replay, and a block-by-block runner built from them.

Every ViT block shares one function (weights without their ``vit.layers.N.`` prefix), so one
compilation serves all of them; ``run_blockwise`` strings the stem, the blocks, the pooler and
projector, and the text prefill together and returns the same stages as ``model.forward``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .config import Molmo2Spec
from .layers import Contract, gelu_tanh, layer_norm, multi_head_attention
from .model import SUBSTAGES, Taps, _lin, layer_weights, pool, projector, resize_positions, vit_block
from .text import prefill


def substage_function(kind: str, spec: Molmo2Spec, contract: Contract) -> Callable:
    """``f(weights, *inputs) -> array`` for one ViT substage kind (weights without the layer prefix)."""
    vit = spec.vit

    def heads(x):
        return x.reshape(*x.shape[:-1], vit.num_heads, vit.head_dim)

    functions: dict[str, Callable] = {
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


@functools.cache
def _compiled(spec: Molmo2Spec, contract: Contract, substages: bool):
    def stem(weights, pixel_values):
        tap = Taps(("*",), ())
        side = int(round(pixel_values.shape[1] ** 0.5))
        x = tap("vision.patch_embed", _lin(contract, weights, "vit.patch_embed", pixel_values))
        pos = resize_positions(weights["vit.pos_embed"], spec.vit.position_grid, (side, side))
        tap("vision.pos_embed", pos)
        tap("vision.positioned", contract.round_state(x + pos[None]))
        return tap.out

    def block(w, x):
        tap = Taps(tuple(f"b.{name}" for name in SUBSTAGES) if substages else (), ())
        out = vit_block(spec, contract, w, x, tap, "b.")
        return out, tap.out

    def head(weights, selected, pooling, input_ids, mm_token_type_ids):
        tap = Taps(("*",))
        features = tap("vision.concatenated", jnp.concatenate(selected, axis=-1))
        features = projector(contract, weights, pool(spec, contract, weights, features, pooling, tap), tap)
        if input_ids is not None:
            tap.out.update(prefill(weights, input_ids, features, mm_token_type_ids, spec=spec, contract=contract))
        return tap.out

    return jax.jit(stem), jax.jit(block), jax.jit(head)


def run_blockwise(
    weights: dict,
    pixel_values,
    pooling,
    input_ids=None,
    mm_token_type_ids=None,
    *,
    spec: Molmo2Spec,
    contract: Contract,
    substages: bool = True,
) -> dict[str, jax.Array]:
    """Every stage of ``model.forward`` (all substages when asked), one compiled block for all blocks."""
    stem, block, head = _compiled(spec, contract, substages)
    out = dict(
        stem({k: weights[k] for k in ("vit.patch_embed.weight", "vit.patch_embed.bias", "vit.pos_embed")}, pixel_values)
    )
    x = out["vision.positioned"]
    for layer in range(spec.execution_depth):
        x, inner = block(layer_weights(weights, f"vit.layers.{layer}."), x)
        out[f"vision.block.{layer}"] = x
        out.update({f"vision.block.{layer}.{name[2:]}": value for name, value in inner.items()})
    selected = [out[f"vision.block.{layer}"] for layer in spec.selected_layers]
    out.update({f"vision.selected.{layer}": out[f"vision.block.{layer}"] for layer in spec.selected_layers})
    rest = {k: v for k, v in weights.items() if not k.startswith("vit.")}
    out.update(head(rest, selected, pooling, input_ids, mm_token_type_ids))
    return out
