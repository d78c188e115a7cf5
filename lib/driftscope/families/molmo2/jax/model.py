"""Molmo2's vision side in JAX: the layers (LayerNorm, tanh GELU, attention, the bicubic position table), the
tower (ViT, pooling, projector) and one function per stage kind for replays."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from driftscope.taps.jax.layers import Contract, linear

from ..plan import parse_stage
from .text import attention_mask, prefill
from .weights import Molmo2Spec

# Molmo2's operators in JAX, honouring the precision contract (dots in ``dot_inputs``, F32 results).
#
# LayerNorm, softmax and RoPE always run in float32. ``Contract``, ``linear`` and ``rms_norm`` are the
# shared ones of the Qwen2.5-VL emitter.


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(variance + eps) * weight + bias


def gelu_tanh(x: jax.Array) -> jax.Array:
    """torch's ``gelu(approximate="tanh")`` (``gelu_pytorch_tanh``)."""
    return jax.nn.gelu(x, approximate=True)


def multi_head_attention(
    contract: Contract, q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array | None = None
) -> jax.Array:
    """Softmax attention over [batch, q_rows, heads, hd] / [batch, kv_rows, heads, hd] -> [batch, q_rows, heads * hd].

    ``valid`` ([batch, kv_rows] bool) masks keys; a fully masked row attends uniformly (as transformers'
    additive minimum does) instead of producing NaN.
    """
    batch, rows, heads, head_dim = q.shape
    qh, kh, vh = (jnp.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # [batch, heads, rows, hd]
    scores = contract.dot(qh, kh, ((3,), (3,)), ((0, 1), (0, 1))) * (head_dim**-0.5)
    if valid is not None:
        scores = jnp.where(valid[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    context = contract.dot(probs, vh, ((3,), (2,)), ((0, 1), (0, 1)))  # [batch, heads, rows, hd]
    return jnp.transpose(context, (0, 2, 1, 3)).reshape(batch, rows, heads * head_dim)


def _cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution kernel (torch's bicubic, A = -0.75)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


@functools.cache
def bicubic_matrix(source: int, target: int) -> np.ndarray:
    """[target, source] weights of torch's ``interpolate(mode="bicubic", align_corners=False)`` on one axis.

    Sample ``i`` reads ``(i + 0.5) * source / target - 0.5``; its four taps clamp at the border.
    """
    out = np.zeros((target, source), dtype=np.float64)
    for i in range(target):
        x = (i + 0.5) * source / target - 0.5
        base = int(np.floor(x))
        for tap in range(base - 1, base + 3):
            out[i, min(max(tap, 0), source - 1)] += _cubic(np.array(x - tap))
    return out.astype(np.float32)


def resize_positions(table: jax.Array, grid: int, target: tuple[int, int]) -> jax.Array:
    """The learned [grid * grid, hidden] position table resized bicubically to ``target`` (rows, cols).

    Identity (no arithmetic) when the grids agree, which is always the case for 378-px crops.
    """
    if target == (grid, grid):
        return table
    rows, cols = bicubic_matrix(grid, target[0]), bicubic_matrix(grid, target[1])
    square = table.reshape(grid, grid, -1)
    resized = jnp.einsum("ry,yxc,sx->rsc", rows, square, cols, precision=jax.lax.Precision.HIGHEST)
    return resized.reshape(target[0] * target[1], -1)


# Molmo2's image path as one JAX function returning every requested stage.
#
# Inputs are the processor's crops ([crops, patches, 588] pixel rows) and the pooling indices
# ([tokens, 4], -1 for padding slots; an input, not a constant, so one lowering serves every image
# whose crop and token counts match). The ViT runs to the execution depth; the selected layers'
# outputs are concatenated in configured order; each pooled token's query is the mean of its valid
# patches and it attends over them (padding slots masked); the SwiGLU projector maps the result to
# the text width. ``forward`` continues into the text decoder's prefill (see ``text``).

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


# Single-stage functions for same-input replay, one per stage kind.
#
# Each is ``f(weights, inputs, side)``: the stage's weights (a ViT block's without their ``vit.layers.N.``
# prefix, so every block of a kind shares one function, one lowering and one compiled artifact), its input
# stages, and side arrays from the replay context (pooling indices, token types). Integer side arrays are int32.


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
