"""Qwen3-VL-MoE in mlx-vlm: Qwen3-VL's loading, tower taps and replays (the tower's module read off its class),
and each sparse layer's MLP taken apart as the transformers side does.

mlx-vlm's sparse block computes the router's softmax, its top-k (``argpartition``: unordered), the renormalized
weights and every chosen expert's output (``switch_mlp``, [..., top_k, hidden]) in one call: the logits and
the expert outputs are recorded as computed, the weights with the block's own operations on those logits; the
choice is sorted by expert id, the weights and outputs with it.
"""

from __future__ import annotations

import copy
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import Recording, dtype_name, shadow, to_numpy
from driftscope.taps.module_taps import tapped
from driftscope.taps.sink import StageSink

from ..qwen3_vl import mlx as dense
from ..qwen3_vl.mlx import load_mlx_model
from .held import to_released
from .plan import moe_piece, sparse_taps, text_config

CAPABILITIES = MLXCapabilities()  # nothing beyond the defaults

rms_norms = dense.rms_norms
run_vision = dense.run_vision
capture = dense.capture


def mlx_view(config: dict) -> dict:
    """The config with ``num_experts`` under the name mlx-vlm reads (transformers 5 writes ``num_local_experts``)."""
    adapted = copy.deepcopy(config)
    text = adapted.setdefault("text_config", {})
    text.setdefault("num_experts", int(text_config(config).get("num_local_experts", 0)))
    return adapted


def load(path: Path, config: dict) -> Any:
    """mlx-vlm's Qwen3-VL-MoE model with the checkpoint's weights (strict load, config adapted in memory): stacked
    experts in transformers 5's layout are put in the released one first, the only one mlx-vlm's sanitizing reads
    (it transposes whatever it finds)."""

    def released(weights: dict) -> dict:
        return {name: to_released(config, name, value) for name, value in weights.items()}

    return load_mlx_model(path, mlx_view(config), vision_type="qwen3_vl_moe", prepare=released)


def routing_weights(block: Any, logits, chosen):
    """The block's own weights of ``chosen``: precise softmax of the logits, gathered, renormalized if it does."""
    import mlx.core as mx

    scores = mx.take_along_axis(mx.softmax(logits, axis=-1, precise=True), chosen, axis=-1)
    return scores / mx.sum(scores, axis=-1, keepdims=True) if block.norm_topk_prob else scores


def sort_choice(chosen, *rows):
    """The chosen experts in ascending id, and ``rows`` ([tokens, top_k, ...]) reordered the same way."""
    import mlx.core as mx

    order = mx.argsort(chosen, axis=-1)
    out = [mx.take_along_axis(chosen, order, axis=-1)]
    for row in rows:
        out.append(mx.take_along_axis(row, order if row.ndim == 2 else order[..., None], axis=1))
    return out


def _record_routing(enter, index: int, layer: Any, sink: StageSink) -> None:
    """The router's logits and the chosen experts' outputs, as the block computes them (sorted by expert id)."""
    stage, block = f"text.layer.{index}", layer.mlp
    seen: dict[str, Any] = {}

    def put(name: str, value) -> None:
        if sink.wants(name):
            sink.put(name, to_numpy(value), native_dtype=dtype_name(value))

    def experts(args, kwargs, out) -> None:
        logits, chosen = seen["logits"], args[1][0]
        chosen, weights, outputs = sort_choice(chosen, routing_weights(block, logits, chosen), out[0])
        put(f"{stage}.mlp.router", logits)
        sink.put(f"{stage}.mlp.chosen", np.array(chosen).astype(np.int64))
        put(f"{stage}.mlp.weights", weights)
        put(f"{stage}.mlp.experts", outputs)

    enter(shadow(block, "gate", Recording(block.gate, lambda a, k, out: seen.update(logits=out[0]))))
    enter(shadow(block, "switch_mlp", Recording(block.switch_mlp, experts)))


def capture_text(model: Any, inputs: ModelInputs, sink: StageSink) -> None:
    """Qwen3-VL's prefill and greedy decode, with the sparse MLPs' pieces recorded during the prefill only (their
    norms and outputs declared in ``plan``, the router and the experts taken apart here)."""
    prefill = _PrefillOnly(sink)
    inner = model.language_model.model
    sparse = [index for index, layer in enumerate(inner.layers) if hasattr(layer.mlp, "switch_mlp")]
    with ExitStack() as stack:
        stack.enter_context(tapped("mlx", inner, sparse_taps(sparse), prefill))
        for index in sparse:
            _record_routing(stack.enter_context, index, inner.layers[index], prefill)
        dense.capture_text(model, inputs, prefill)


class _PrefillOnly:
    """The sink, refusing a second value of a stage (the decode steps reach the recorders too): drops it."""

    def __init__(self, sink: StageSink):
        self._sink, self._seen = sink, set()

    def put(self, stage_id: str, value, **kwargs) -> None:
        if stage_id in self._seen:
            return
        self._seen.add(stage_id)
        self._sink.put(stage_id, value, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def replay(model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
    """A sparse MLP piece through the layer's own modules; every other stage as Qwen3-VL replays it."""
    import mlx.core as mx
    from mlx_vlm.models.base import create_attention_mask

    piece = moe_piece(stage_id)
    if piece is None:
        return dense.replay(model, stage_id, inputs, ctx)
    inner = model.language_model.model
    layer = inner.layers[int(stage_id.split(".")[2])]
    dtype = inner.embed_tokens.weight.dtype
    x = mx.array(np.ascontiguousarray(inputs[0], dtype=np.float32)).astype(dtype)
    block = layer.mlp
    if piece == "residual1":
        h = x[None]
        positions = mx.array(ctx.text_positions)[:, None, :]
        rotary = layer.self_attn.rotary_emb
        embeddings = None if rotary.fused_apply else rotary(h, positions)
        attn = layer.self_attn(layer.input_layernorm(h), create_attention_mask(h, [None]), None, positions, embeddings)
        out = (h + attn)[0]
    elif piece == "mlp.in":
        out = layer.post_attention_layernorm(x)
    elif piece == "mlp.router":
        out = block.gate(x)
    elif piece == "mlp":
        out = block(x[None])[0]
    else:
        chosen = mx.array(np.asarray(inputs[1], dtype=np.int32))
        if piece == "mlp.experts":
            out = block.switch_mlp(x, chosen)
        else:
            out = routing_weights(block, block.gate(x), chosen)
    mx.eval(out)
    return to_numpy(out)
