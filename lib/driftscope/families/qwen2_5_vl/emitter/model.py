"""The Qwen2.5-VL vision tower as one JAX function returning every requested stage.

Inputs are a packed bucket (see ``driftscope.geometry.packing``): pixel rows in raster order
(padding rows at the end), the gather that puts them in window order, their (h, w) positions, and
segment ids for window and full attention. Outputs are ``{stage id: array}`` for the requested
taps, in bucket rows; the final ``vision.merger`` (raster order) is always returned.
"""

from __future__ import annotations

from collections.abc import Iterable

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

FINAL = "vision.merger"


class _Taps:
    def __init__(self, wanted: Iterable[str]):
        self.wanted = set(wanted) | {FINAL}
        self.out: dict[str, jax.Array] = {}

    def __call__(self, stage_id: str, value: jax.Array) -> jax.Array:
        if stage_id in self.wanted:
            self.out[stage_id] = value
        return value


def _block(
    spec: VisionSpec,
    contract: Contract,
    w: dict,
    b: int,
    x,
    cos,
    sin,
    mask,
    tap: _Taps,
    p: str | None = None,
    s: str | None = None,
    out_id: str | None = None,
):
    p = f"blocks.{b}." if p is None else p  # weight name prefix
    s = f"vision.block.{b}." if s is None else s  # stage id prefix
    out_id = f"vision.block.{b}" if out_id is None else out_id
    rows = x.shape[0]

    def at(kind: str) -> Contract:  # the operator computing ``kind``'s contract: float32 where the policy keeps it
        return contract.at(s + kind)

    h = tap(s + "norm1", at("norm1").round_state(rms_norm(x, w[p + "norm1.weight"], spec.eps)))
    qkv = linear(at("attn.qkv"), h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"])
    q, k, v = (qkv.reshape(rows, 3, spec.num_heads, spec.head_dim)[:, i] for i in range(3))
    q = tap(s + "attn.q", apply_rope(q, cos, sin))
    k = tap(s + "attn.k", apply_rope(k, cos, sin))
    v = tap(s + "attn.v", v)
    context = tap(s + "attn.context", attention(at("attn.context"), q, k, v, mask))
    out = tap(s + "attn.out", linear(at("attn.out"), context, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"]))
    x = tap(s + "residual1", at("residual1").round_state(x + out))
    h = tap(s + "norm2", at("norm2").round_state(rms_norm(x, w[p + "norm2.weight"], spec.eps)))
    gate = tap(s + "mlp.gate", linear(at("mlp.gate"), h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.gate_proj.bias"]))
    act = tap(s + "mlp.act", jax.nn.silu(gate))
    up = tap(s + "mlp.up", linear(at("mlp.up"), h, w[p + "mlp.up_proj.weight"], w[p + "mlp.up_proj.bias"]))
    product = tap(s + "mlp.product", act * up)
    down = linear(at("mlp.down"), product, w[p + "mlp.down_proj.weight"], w[p + "mlp.down_proj.bias"])
    down = tap(s + "mlp.down", down)
    return tap(out_id, contract.at(out_id).round_state(x + down))


def _merger(spec: VisionSpec, contract: Contract, weights: dict, x, merged_restore, tap: _Taps, p: str = "merger."):
    at = contract.at
    h = tap(
        "vision.merger.norm", at("vision.merger.norm").round_state(rms_norm(x, weights[p + "ln_q.weight"], spec.eps))
    )
    h = h.reshape(-1, spec.hidden_size * spec.merge_unit)
    hidden = linear(at("vision.merger.hidden"), h, weights[p + "mlp.0.weight"], weights[p + "mlp.0.bias"])
    h = tap("vision.merger.hidden", jax.nn.gelu(hidden, approximate=False))
    merged = linear(at("vision.merger.window"), h, weights[p + "mlp.2.weight"], weights[p + "mlp.2.bias"])
    merged = tap("vision.merger.window", merged)
    return tap(FINAL, jnp.take(merged, merged_restore, axis=0))  # inverse window permutation: raster order


# Block-by-block pieces: the stem, one block (shared by every block of an attention kind), the merger.


def stem_graph(weights: dict, pixel_values, patch_gather, positions, *, spec: VisionSpec, contract: Contract):
    """Patch embedding and rotary tables (raster, as tapped), and the window-ordered block inputs."""
    x = patch_embed(contract, pixel_values, weights["proj.weight"])
    cos, sin = rotary_tables(positions, spec.head_dim, spec.rope_theta)
    return {
        "vision.patch_embed": x,
        "vision.rotary.cos": cos,
        "vision.rotary.sin": sin,
        "x": contract.round_state(jnp.take(x, patch_gather, axis=0)),
        "cos": jnp.take(cos, patch_gather, axis=0),
        "sin": jnp.take(sin, patch_gather, axis=0),
    }


def block_graph(weights: dict, x, cos, sin, segments, *, spec: VisionSpec, contract: Contract, substages: bool = False):
    """One block (weights without their ``blocks.N.`` prefix): ``out`` and, if asked, every substage."""
    tap = _Taps(("block.out",) + (tuple(f"block.{name}" for name in SUBSTAGES) if substages else ()))
    _block(spec, contract, weights, 0, x, cos, sin, segment_mask(segments), tap, p="", s="block.", out_id="block.out")
    tap.out.pop(FINAL, None)
    return tap.out


def merger_graph(weights: dict, x, merged_restore, *, spec: VisionSpec, contract: Contract):
    tap = _Taps(("vision.merger.norm", "vision.merger.hidden", "vision.merger.window"))
    _merger(spec, contract, weights, x, merged_restore, tap, p="")
    return tap.out


SUBSTAGES = (
    "norm1",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.context",
    "attn.out",
    "residual1",
    "norm2",
    "mlp.gate",
    "mlp.act",
    "mlp.up",
    "mlp.product",
    "mlp.down",
)


def vision_tower(
    weights: dict,
    pixel_values: jax.Array,
    patch_gather: jax.Array,
    positions: jax.Array,
    window_segments: jax.Array,
    image_segments: jax.Array,
    merged_restore: jax.Array,
    *,
    spec: VisionSpec,
    contract: Contract,
    taps: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """Run the tower on one packed bucket; returns the requested stages (bucket rows)."""
    tap = _Taps(taps)
    x = tap(
        "vision.patch_embed",
        patch_embed(contract.at("vision.patch_embed"), pixel_values, weights["patch_embed.proj.weight"]),
    )
    cos, sin = rotary_tables(positions, spec.head_dim, spec.rope_theta)
    tap("vision.rotary.cos", cos)
    tap("vision.rotary.sin", sin)
    # window partition: patch rows and their rotary rows follow the same permutation
    x = contract.round_state(jnp.take(x, patch_gather, axis=0))
    cos, sin = jnp.take(cos, patch_gather, axis=0), jnp.take(sin, patch_gather, axis=0)
    window_mask, full_mask = segment_mask(window_segments), segment_mask(image_segments)
    for b in range(spec.depth):
        x = _block(spec, contract, weights, b, x, cos, sin, full_mask if spec.is_full(b) else window_mask, tap)
    _merger(spec, contract, weights, x, merged_restore, tap)
    return tap.out
