"""The Qwen3-VL vision tower as one JAX function returning every requested stage.

Inputs are a packed bucket (see ``driftscope.families.qwen3_vl.geometry.pack_bucket``): pixel rows in
the processor's order (2x2 merge blocks one after another; padding rows at the end), the position
table's interpolation indices and weights, the (h, w) rotary positions and one segment id per image
frame. There are no windows, so every stage keeps the processor's order. Outputs are
``{stage id: array}`` for the requested taps, in bucket rows; the main merger (``vision.merger``) and
every DeepStack branch (``vision.deepstack.K``, fed by block ``deepstack_visual_indexes[K]``) are
always returned: they are what the text decoder reads.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax

from .config import VisionSpec
from .layers import (
    Contract,
    apply_rope,
    attention,
    gelu,
    interpolate_pos_embed,
    layer_norm,
    linear,
    patch_embed,
    rotary_tables,
    segment_mask,
)

FINAL = "vision.merger"

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

#: Substages of the main merger and of every DeepStack merger; the output is the prefix itself.
MERGER_SUBSTAGES = ("norm", "fc1", "act")


def deepstack_id(branch: int) -> str:
    return f"vision.deepstack.{branch}"


def final_ids(spec: VisionSpec) -> tuple[str, ...]:
    """The stages every call returns: the main merger and each DeepStack branch's output."""
    return (FINAL,) + tuple(deepstack_id(k) for k in range(len(spec.deepstack_visual_indexes)))


class _Taps:
    def __init__(self, wanted: Iterable[str], always: Iterable[str] = ()):
        self.wanted = set(wanted) | set(always)
        self.out: dict[str, jax.Array] = {}

    def __call__(self, stage_id: str, value: jax.Array) -> jax.Array:
        if stage_id in self.wanted:
            self.out[stage_id] = value
        return value


def block(spec: VisionSpec, contract: Contract, w: dict, x, cos, sin, mask, tap, p: str, s: str, out_id: str):
    """One vision block: weights under prefix ``p``, substage ids under prefix ``s``, output ``out_id``. Each
    operator runs under ``contract.at`` its stage (float32 where a mixed policy keeps it there)."""
    rows = x.shape[0]

    def at(kind: str) -> Contract:
        return contract.at(s + kind)

    h = layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"], spec.eps)
    h = tap(s + "norm1", at("norm1").round_state(h))
    qkv = linear(at("attn.qkv"), h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"])
    q, k, v = (qkv.reshape(rows, 3, spec.num_heads, spec.head_dim)[:, i] for i in range(3))
    q = tap(s + "attn.q", apply_rope(q, cos, sin))
    k = tap(s + "attn.k", apply_rope(k, cos, sin))
    v = tap(s + "attn.v", v)
    context = tap(s + "attn.context", attention(at("attn.context"), q, k, v, mask))
    out = tap(s + "attn.out", linear(at("attn.out"), context, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"]))
    x = tap(s + "residual1", at("residual1").round_state(x + out))
    h = layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"], spec.eps)
    h = tap(s + "norm2", at("norm2").round_state(h))
    fc1 = linear(at("mlp.fc1"), h, w[p + "mlp.linear_fc1.weight"], w[p + "mlp.linear_fc1.bias"])
    fc1 = tap(s + "mlp.fc1", fc1)
    act = tap(s + "mlp.act", gelu(fc1, spec.tanh_gelu))
    fc2 = linear(at("mlp.fc2"), act, w[p + "mlp.linear_fc2.weight"], w[p + "mlp.linear_fc2.bias"])
    fc2 = tap(s + "mlp.fc2", fc2)
    return tap(out_id, contract.at(out_id).round_state(x + fc2))


def merger(spec: VisionSpec, contract: Contract, w: dict, x, tap, p: str, s: str, postshuffle: bool):
    """A patch merger: LayerNorm (over hidden before the 2x2 regroup, or over 4x hidden after it for a
    DeepStack branch), fc1, exact GELU, fc2. ``s`` is the output's stage id and its substages' prefix; the second
    projection's operator is ``<s>.fc2`` (``contract.at``)."""
    if postshuffle:
        x = x.reshape(-1, spec.merged_hidden)
    h = layer_norm(x, w[p + "norm.weight"], w[p + "norm.bias"], spec.eps)
    h = tap(s + ".norm", contract.at(s + ".norm").round_state(h))
    h = h.reshape(-1, spec.merged_hidden)
    fc1 = tap(s + ".fc1", linear(contract.at(s + ".fc1"), h, w[p + "linear_fc1.weight"], w[p + "linear_fc1.bias"]))
    act = tap(s + ".act", gelu(fc1, tanh=False))
    return tap(s, linear(contract.at(s + ".fc2"), act, w[p + "linear_fc2.weight"], w[p + "linear_fc2.bias"]))


def vision_tower(
    weights: dict,
    pixel_values: jax.Array,
    interp_indices: jax.Array,
    interp_weights: jax.Array,
    positions: jax.Array,
    segments: jax.Array,
    *,
    spec: VisionSpec,
    contract: Contract,
    taps: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """Run the tower on one packed bucket; returns the requested stages and every final output (bucket rows)."""
    tap = _Taps(taps, final_ids(spec))
    w = weights
    x = tap(
        "vision.patch_embed",
        patch_embed(
            contract.at("vision.patch_embed"), pixel_values, w["patch_embed.proj.weight"], w["patch_embed.proj.bias"]
        ),
    )
    pos = tap("vision.pos_embed", interpolate_pos_embed(w["pos_embed.weight"], interp_indices, interp_weights))
    x = tap("vision.positioned", contract.at("vision.positioned").round_state(x + pos))
    cos, sin = rotary_tables(positions, spec.head_dim, spec.rope_theta)
    tap("vision.rotary.cos", cos)
    tap("vision.rotary.sin", sin)
    mask = segment_mask(segments)
    for b in range(spec.depth):
        x = block(spec, contract, w, x, cos, sin, mask, tap, f"blocks.{b}.", f"vision.block.{b}.", f"vision.block.{b}")
        branch = spec.branch(b)
        if branch is not None:
            merger(spec, contract, w, x, tap, f"deepstack_merger_list.{branch}.", deepstack_id(branch), True)
    merger(spec, contract, w, x, tap, "merger.", FINAL, False)
    return tap.out


# Block-by-block pieces: the stem, one block (shared by every block), one merger of each kind.


def stem_graph(weights: dict, pixel_values, interp_indices, interp_weights, positions, *, spec, contract):
    """Patch embedding, the interpolated position table, their sum and the rotary tables (bucket rows)."""
    x = patch_embed(contract, pixel_values, weights["patch_embed.proj.weight"], weights["patch_embed.proj.bias"])
    pos = interpolate_pos_embed(weights["pos_embed.weight"], interp_indices, interp_weights)
    cos, sin = rotary_tables(positions, spec.head_dim, spec.rope_theta)
    return {
        "vision.patch_embed": x,
        "vision.pos_embed": pos,
        "vision.positioned": contract.round_state(x + pos),
        "vision.rotary.cos": cos,
        "vision.rotary.sin": sin,
    }


def block_graph(weights: dict, x, cos, sin, segments, *, spec, contract, substages: bool = False):
    """One block (weights without their ``blocks.N.`` prefix): ``block.out`` and, if asked, every substage."""
    tap = _Taps(("block.out",) + (tuple(f"block.{name}" for name in SUBSTAGES) if substages else ()))
    block(spec, contract, weights, x, cos, sin, segment_mask(segments), tap, "", "block.", "block.out")
    return tap.out


def merger_graph(weights: dict, x, *, spec, contract, postshuffle: bool):
    """One patch merger (weights without their prefix): ``merger`` and its substages ``merger.<sub>``."""
    tap = _Taps(("merger",) + tuple(f"merger.{name}" for name in MERGER_SUBSTAGES))
    merger(spec, contract, weights, x, tap, "", "merger", postshuffle)
    return tap.out
