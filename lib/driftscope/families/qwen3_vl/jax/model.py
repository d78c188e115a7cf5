"""Qwen3-VL's vision tower in JAX (with its DeepStack branches): the layers it is built from, the tower, and one
function per stage (what the compiled path lowers and replays)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp

from driftscope.taps.jax.layers import (
    Contract,
    apply_rope,
    attention,
    linear,
    rms_norm,
    rotary_tables,
    rotate_half,
    segment_mask,
)

from ..plan import parse_stage
from .weights import VisionSpec

# Qwen3-VL's operators in JAX, each honouring the precision contract.
#
# The contract, linear layers, RMSNorm, axial RoPE and masked attention are the shared ones
# (``driftscope.taps.jax.layers``). What Qwen3-VL adds: LayerNorm with centered variance, the patch
# embedding's bias, the interpolated position table, GELU in both forms. Normalization, softmax, RoPE
# and the position interpolation always run in float32.

__all__ = [
    "Contract",
    "apply_rope",
    "attention",
    "gelu",
    "interpolate_pos_embed",
    "layer_norm",
    "linear",
    "patch_embed",
    "rms_norm",
    "rotary_tables",
    "rotate_half",
    "segment_mask",
]


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis: mean removed, then the (biased) variance of the centered values."""
    x = x.astype(jnp.float32)
    centered = x - jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(variance + eps) * weight + bias


def gelu(x: jax.Array, tanh: bool) -> jax.Array:
    """GELU: the tanh approximation (``gelu_pytorch_tanh``) or the exact erf form (``nn.GELU()``)."""
    return jax.nn.gelu(x, approximate=tanh)


def patch_embed(contract: Contract, pixels: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    """The Conv3d patch embedding (stride equals kernel): one dot over the flattened patch, plus bias."""
    return contract.dot(pixels, weight.reshape(weight.shape[0], -1), ((1,), (1,))) + bias


def interpolate_pos_embed(table: jax.Array, indices: jax.Array, weights: jax.Array) -> jax.Array:
    """Bilinear resampling of the learned table: each row is the weighted sum of its 4 table rows (float32)."""
    rows = jnp.take(table.astype(jnp.float32), indices, axis=0)  # [patches, 4, hidden]
    return jnp.sum(rows * weights[:, :, None].astype(jnp.float32), axis=1)


# The Qwen3-VL vision tower as one JAX function returning every requested stage.
#
# Inputs are a packed bucket (see ``driftscope.families.qwen3_vl.geometry.pack_bucket``): pixel rows in
# the processor's order (2x2 merge blocks one after another; padding rows at the end), the position
# table's interpolation indices and weights, the (h, w) rotary positions and one segment id per image
# frame. There are no windows, so every stage keeps the processor's order. Outputs are
# ``{stage id: array}`` for the requested taps, in bucket rows; the main merger (``vision.merger``) and
# every DeepStack branch (``vision.deepstack.K``, fed by block ``deepstack_visual_indexes[K]``) are
# always returned: they are what the text decoder reads.

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


# Single-stage functions of the tower, for same-input replay (one function per stage kind).
#
# Each takes the stage's weights (block or merger prefix stripped, so every block shares one function,
# one lowering and one compiled artifact, and so does every DeepStack merger) and its inputs, and
# honours the contract. Kinds: ``patch_embed``, ``pos_embed`` (reads the table rows and weights the host
# computed from the grid), ``positioned``, ``block`` and each block substage
# (``norm1`` ... ``mlp.fc2``), ``merger.<sub>`` and ``deepstack.<sub>`` for ``norm``, ``fc1``, ``act``
# and ``output``.


def _qkv(spec: VisionSpec, contract: Contract, w: dict, h):
    rows = h.shape[0]
    qkv = linear(contract, h, w["attn.qkv.weight"], w["attn.qkv.bias"])
    return [qkv.reshape(rows, 3, spec.num_heads, spec.head_dim)[:, i] for i in range(3)]


def _merger_functions(spec: VisionSpec, contract: Contract, prefix: str, postshuffle: bool) -> dict[str, Callable]:
    def norm(w, args, cos, sin, seg):
        x = args[0].reshape(-1, spec.merged_hidden) if postshuffle else args[0]
        return contract.round_state(layer_norm(x, w["norm.weight"], w["norm.bias"], spec.eps))

    def fc1(w, args, cos, sin, seg):
        return linear(contract, args[0].reshape(-1, spec.merged_hidden), w["linear_fc1.weight"], w["linear_fc1.bias"])

    return {
        f"{prefix}.norm": norm,
        f"{prefix}.fc1": fc1,
        f"{prefix}.act": lambda w, args, cos, sin, seg: gelu(args[0], tanh=False),
        f"{prefix}.output": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["linear_fc2.weight"], w["linear_fc2.bias"]
        ),
    }


def stage_function(kind: str, spec: VisionSpec, contract: Contract) -> Callable:
    """``f(weights, inputs: tuple, cos, sin, segments) -> array`` for one stage kind."""
    eps = spec.eps

    def whole_block(w, args, cos, sin, seg):
        return block(spec, contract, w, args[0], cos, sin, segment_mask(seg), lambda _, v: v, "", "", "out")

    def norm(name):
        return lambda w, args, cos, sin, seg: contract.round_state(
            layer_norm(args[0], w[f"{name}.weight"], w[f"{name}.bias"], eps)
        )

    def projected(index, rotate):
        def function(w, args, cos, sin, seg):
            value = _qkv(spec, contract, w, args[0])[index]
            return apply_rope(value, cos, sin) if rotate else value

        return function

    functions: dict[str, Callable] = {
        "patch_embed": lambda w, args, cos, sin, seg: patch_embed(
            contract, args[0], w["patch_embed.proj.weight"], w["patch_embed.proj.bias"]
        ),
        "pos_embed": lambda w, args, cos, sin, seg: interpolate_pos_embed(w["pos_embed.weight"], args[0], args[1]),
        "positioned": lambda w, args, cos, sin, seg: contract.round_state(args[0] + args[1]),
        "block": whole_block,
        "norm1": norm("norm1"),
        "attn.q": projected(0, True),
        "attn.k": projected(1, True),
        "attn.v": projected(2, False),
        "attn.context": lambda w, args, cos, sin, seg: attention(contract, *args, segment_mask(seg)),
        "attn.out": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["attn.proj.weight"], w["attn.proj.bias"]
        ),
        "residual1": lambda w, args, cos, sin, seg: contract.round_state(args[0] + args[1]),
        "norm2": norm("norm2"),
        "mlp.fc1": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.linear_fc1.weight"], w["mlp.linear_fc1.bias"]
        ),
        "mlp.act": lambda w, args, cos, sin, seg: gelu(args[0], spec.tanh_gelu),
        "mlp.fc2": lambda w, args, cos, sin, seg: linear(
            contract, args[0], w["mlp.linear_fc2.weight"], w["mlp.linear_fc2.bias"]
        ),
        **_merger_functions(spec, contract, "merger", postshuffle=False),
        **_merger_functions(spec, contract, "deepstack", postshuffle=True),
    }
    return functions[kind]


def stage_weights(weights: dict, stage_id: str) -> dict:
    """The weights one stage reads, keyed without the block/merger prefix."""
    block_index, branch, kind = parse_stage(stage_id)
    if block_index is not None:
        prefix = f"blocks.{block_index}."
    elif branch is not None:
        prefix = f"deepstack_merger_list.{branch}."
    elif kind.startswith("merger."):
        prefix = "merger."
    else:  # the stem's stages read the patch embedding or the position table
        return {name: value for name, value in weights.items() if name.startswith(("patch_embed.", "pos_embed."))}
    return {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}
