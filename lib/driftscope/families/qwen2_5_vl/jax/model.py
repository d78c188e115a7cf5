"""Qwen2.5-VL's vision tower in JAX: its spec from config.json, its weights, the tower built from the
shared layers of ``driftscope.taps.jax.layers``, and one function per stage (what the compiled path lowers)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from driftscope.errors import CheckpointError
from driftscope.model.weightfile import TensorFiles
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

# The vision settings the emitter needs, read from a checkpoint's config.json.


@dataclass(frozen=True)
class VisionSpec:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    window_size: int
    fullatt_block_indexes: tuple[int, ...]
    rope_theta: float
    hidden_act: str = "silu"
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    def is_full(self, block: int) -> bool:
        return block in self.fullatt_block_indexes

    @classmethod
    def from_config(cls, config: dict) -> VisionSpec:
        vision = dict(config.get("vision_config") or {})
        if not vision:
            raise CheckpointError(
                "config.json has no vision_config", "use a Qwen2.5-VL checkpoint saved by transformers"
            )
        rope = vision.get("rope_parameters") or {}
        act = vision.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"vision hidden_act {act!r} is not supported by the emitter", "use silu (Qwen2.5-VL)")
        return cls(
            depth=int(vision.get("depth", 32)),
            hidden_size=int(vision.get("hidden_size", 1280)),
            num_heads=int(vision.get("num_heads", 16)),
            intermediate_size=int(vision.get("intermediate_size", 3420)),
            out_hidden_size=int(vision.get("out_hidden_size", 3584)),
            in_channels=int(vision.get("in_channels", 3)),
            patch_size=int(vision.get("patch_size", 14)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            window_size=int(vision.get("window_size", 112)),
            fullatt_block_indexes=tuple(int(i) for i in vision.get("fullatt_block_indexes", [7, 15, 23, 31])),
            rope_theta=float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))),
        )


# Vision weights from the checkpoint's safetensors, checked tensor by tensor against the config.

PREFIXES = ("visual.", "model.visual.")  # transformers 5 saves the legacy "visual." keys


def expected_shapes(spec: VisionSpec) -> dict[str, tuple[int, ...]]:
    """Every vision tensor the emitter reads, by its name under the ``visual.`` prefix."""
    d, i, merged = spec.hidden_size, spec.intermediate_size, spec.hidden_size * spec.merge_unit
    p, t, c = spec.patch_size, spec.temporal_patch_size, spec.in_channels
    shapes = {"patch_embed.proj.weight": (d, c, t, p, p)}
    for b in range(spec.depth):
        shapes.update(
            {
                f"blocks.{b}.norm1.weight": (d,),
                f"blocks.{b}.norm2.weight": (d,),
                f"blocks.{b}.attn.qkv.weight": (3 * d, d),
                f"blocks.{b}.attn.qkv.bias": (3 * d,),
                f"blocks.{b}.attn.proj.weight": (d, d),
                f"blocks.{b}.attn.proj.bias": (d,),
                f"blocks.{b}.mlp.gate_proj.weight": (i, d),
                f"blocks.{b}.mlp.gate_proj.bias": (i,),
                f"blocks.{b}.mlp.up_proj.weight": (i, d),
                f"blocks.{b}.mlp.up_proj.bias": (i,),
                f"blocks.{b}.mlp.down_proj.weight": (d, i),
                f"blocks.{b}.mlp.down_proj.bias": (d,),
            }
        )
    shapes.update(
        {
            "merger.ln_q.weight": (d,),
            "merger.mlp.0.weight": (merged, merged),
            "merger.mlp.0.bias": (merged,),
            "merger.mlp.2.weight": (spec.out_hidden_size, merged),
            "merger.mlp.2.bias": (spec.out_hidden_size,),
        }
    )
    return shapes


def load_vision_weights(path: str | Path, spec: VisionSpec) -> dict[str, np.ndarray]:
    """``{name: aligned float32 array}`` for every vision tensor; a missing or misshapen tensor is named."""
    files = TensorFiles(path)
    prefix = next((p for p in PREFIXES if any(name.startswith(p) for name in files.names())), None)
    if prefix is None:
        raise CheckpointError(
            f"checkpoint {path} has no vision tensors (no key starts with {PREFIXES})",
            "use a Qwen2.5-VL checkpoint that includes the vision tower",
        )
    weights: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(spec).items():
        weights[name] = files.read_checked(prefix + name, shape, f" (the config's depth is {spec.depth})")
    return weights


# The Qwen2.5-VL vision tower as one JAX function returning every requested stage.
#
# Inputs are a packed bucket (see ``geometry.pack_images``): pixel rows in raster order
# (padding rows at the end), the gather that puts them in window order, their (h, w) positions, and
# segment ids for window and full attention. Outputs are ``{stage id: array}`` for the requested
# taps, in bucket rows; the final ``vision.merger`` (raster order) is always returned.

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


# Single-stage functions of the tower, for same-input replay (one function per stage kind).
#
# Each takes the stage's weights (block prefix stripped, so every block of a kind shares one
# function, one lowering and one compiled artifact) and its inputs, and honours the contract.


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
