"""Single-stage functions of the tower, for same-input replay (one function per stage kind).

Each takes the stage's weights (block prefix stripped, so every block of a kind shares one
function, one lowering and one compiled artifact) and its inputs, and honours the contract.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from driftscope.taps.jax.layers import (
    Contract,
    apply_rope,
    attention,
    linear,
    patch_embed,
    rms_norm,
    rotary_tables,
    segment_mask,
)

from .config import VisionSpec


def _qkv(spec, contract, w, h):
    rows = h.shape[0]
    qkv = linear(contract, h, w["attn.qkv.weight"], w["attn.qkv.bias"])
    return [qkv.reshape(rows, 3, spec.num_heads, spec.head_dim)[:, i] for i in range(3)]


def stage_function(kind: str, spec: VisionSpec, contract: Contract) -> Callable:
    """``f(weights, inputs: tuple, cos, sin, segments) -> array`` for one stage kind."""
    eps = spec.eps

    def block(w, x, cos, sin, segments):
        mask = segment_mask(segments)
        h = contract.round_state(rms_norm(x, w["norm1.weight"], eps))
        q, k, v = _qkv(spec, contract, w, h)
        context = attention(contract, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, mask)
        x = contract.round_state(x + linear(contract, context, w["attn.proj.weight"], w["attn.proj.bias"]))
        h = contract.round_state(rms_norm(x, w["norm2.weight"], eps))
        gate = jax.nn.silu(linear(contract, h, w["mlp.gate_proj.weight"], w["mlp.gate_proj.bias"]))
        up = linear(contract, h, w["mlp.up_proj.weight"], w["mlp.up_proj.bias"])
        return contract.round_state(x + linear(contract, gate * up, w["mlp.down_proj.weight"], w["mlp.down_proj.bias"]))

    functions: dict[str, Callable] = {
        "patch_embed": lambda w, args, cos, sin, seg: patch_embed(contract, args[0], w["proj.weight"]),
        # args[0]: each raster row's (h, w) position, as the host computes it from the grid
        "rotary.cos": lambda w, args, cos, sin, seg: rotary_tables(args[0], spec.head_dim, spec.rope_theta)[0],
        "rotary.sin": lambda w, args, cos, sin, seg: rotary_tables(args[0], spec.head_dim, spec.rope_theta)[1],
        "block": lambda w, args, cos, sin, seg: block(w, args[0], cos, sin, seg),
        "norm1": lambda w, args, cos, sin, seg: contract.round_state(rms_norm(args[0], w["norm1.weight"], eps)),
        "attn.q": lambda w, args, cos, sin, seg: apply_rope(_qkv(spec, contract, w, args[0])[0], cos, sin),
        "attn.k": lambda w, args, cos, sin, seg: apply_rope(_qkv(spec, contract, w, args[0])[1], cos, sin),
        "attn.v": lambda w, args, cos, sin, seg: _qkv(spec, contract, w, args[0])[2],
        "attn.context": lambda w, args, cos, sin, seg: attention(contract, *args, segment_mask(seg)),
        "attn.out": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["attn.proj.weight"], w["attn.proj.bias"]
        ),
        "residual1": lambda w, args, cos, sin, seg: contract.round_state(args[0] + args[1]),
        "norm2": lambda w, args, cos, sin, seg: contract.round_state(rms_norm(args[0], w["norm2.weight"], eps)),
        "mlp.gate": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.gate_proj.weight"], w["mlp.gate_proj.bias"]
        ),
        "mlp.act": lambda w, args, cos, sin, seg: jax.nn.silu(args[0]),
        "mlp.up": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.up_proj.weight"], w["mlp.up_proj.bias"]
        ),
        "mlp.product": lambda w, args, cos, sin, seg: args[0] * args[1],
        "mlp.down": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.down_proj.weight"], w["mlp.down_proj.bias"]
        ),
        "merger.norm": lambda w, args, cos, sin, seg: contract.round_state(rms_norm(args[0], w["ln_q.weight"], eps)),
        "merger.hidden": lambda w, args, cos, sin, seg: jax.nn.gelu(
            linear(
                contract, args[0].reshape(-1, spec.hidden_size * spec.merge_unit), w["mlp.0.weight"], w["mlp.0.bias"]
            ),
            approximate=False,
        ),
        "merger.window": lambda w, args, cos, sin, seg: linear(contract, args[0], w["mlp.2.weight"], w["mlp.2.bias"]),
        # args[1]: the window-order row to read for each raster row (the inverse window permutation)
        "merger": lambda w, args, cos, sin, seg: jnp.take(args[0], args[1], axis=0),
    }
    return functions[kind]


def stage_weights(weights: dict, block: int | None, kind: str) -> dict:
    """The weights one stage reads, keyed without the block/merger/patch embedding prefix."""
    if block is None and kind in ("rotary.cos", "rotary.sin", "merger"):
        return {}
    prefix = "patch_embed." if kind == "patch_embed" else "merger." if block is None else f"blocks.{block}."
    return prefixed(weights, prefix)


def prefixed(weights: dict, prefix: str) -> dict:
    """The weights under ``prefix``, keyed without it (``merger.``: what the whole merger reads)."""
    return {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}
