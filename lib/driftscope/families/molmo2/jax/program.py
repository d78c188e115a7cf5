"""What the compiled runtimes (``jax``, ``iree``) ask of Molmo2: the emitted model, the call's shape, the
lowered image path (ViT, selected layers, pooling with the index tensor as an input, projector), its pieces
for block-by-block runs, the text prefill and greedy decode, and the single-stage replay functions.

The graph runs the images' exact crops and tokens: no bucket padding, so every stage's rows are real.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from driftscope.families.capabilities import CompiledCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.precision import PrecisionPolicy
from driftscope.taps.jax.emitted import EmittedModel
from driftscope.taps.jax.graph import LoweredGraph, contract_for, lower_graph
from driftscope.taps.jax.layers import Contract
from driftscope.taps.sink import StageSink, compiled_cache, put_greedy
from driftscope.taps.stages import Stage

from ....errors import ParameterError
from .model import (
    FINAL,
    SUBSTAGES,
    block_graph,
    head_graph,
    layer_weights,
    replay_function,
    stem_graph,
    vision_features,
)
from .weights import Molmo2Spec, load_weights

#: The text side decodes greedily after the prefill (``text.generate.*``): see :func:`capture_text`.
CAPABILITIES = CompiledCapabilities(decodes=True)
#: Stages computed on the host (the processor's arrays), not by the graph.
HOST_STAGES = ("inputs.pixel_values", "inputs.pooling", "inputs.grids", "inputs.num_crops", "inputs.image_tokens")
#: What the text side reads of the image path (every lowering returns it).
TOWER_OUTPUTS = (FINAL,)


@dataclass(frozen=True)
class Call:
    """The shape of one call: every crop and every pooled token of the images (nothing padded)."""

    crops: int
    patches: int
    tokens: int
    slots: int

    @property
    def rows(self) -> int:
        return self.crops * self.patches

    @property
    def active(self) -> int:
        return self.rows

    @property
    def active_rows(self) -> list[list[int]]:
        return [[0, self.rows]]


def load(checkpoint) -> EmittedModel:
    spec = Molmo2Spec.from_config(checkpoint.config)
    return EmittedModel(spec, load_weights(checkpoint.path, spec, parts=("vision",)), checkpoint)


def bucket(model: EmittedModel, inputs: ModelInputs, rows: int | None) -> Call:
    if rows is not None:
        raise ParameterError(
            f"options.bucket={rows} does not apply to Molmo2: its graph runs the images' exact crops and tokens",
            "drop options.bucket for this checkpoint",
        )
    crops, patches, _ = inputs["pixel_values"].shape
    tokens, slots = inputs["pooling"].shape
    return Call(int(crops), int(patches), int(tokens), int(slots))


def put_host_stages(call: Call, sink: StageSink) -> None:
    """Nothing beyond the processor's arrays: the pooling indices are an input of the graph."""


def output_rows(call: Call, stage: Stage) -> int | None:
    """Every row of every output is real (None: the whole first axis)."""
    return None


def lower(model: EmittedModel, policy: PrecisionPolicy, call: Call, taps: tuple[str, ...]) -> LoweredGraph:
    """The image path for these crops and tokens; weights and the pooling indices are arguments."""
    spec = model.spec
    taps = tuple(sorted(set(taps)))
    body = functools.partial(vision_features, spec=spec, contract=contract_for(policy), taps=taps)
    inputs = {
        "pixel_values": ((call.crops, call.patches, spec.vit.patch_dim), "float32"),
        "pooling": ((call.tokens, call.slots), "int32"),
    }
    header = [
        "// driftscope: Molmo2 image path (driftscope.families.molmo2.jax)",
        f"// crops {call.crops}, pooled tokens {call.tokens}; ViT layers run {spec.execution_depth}, "
        f"selected {list(spec.selected_layers)}",
    ]
    return lower_graph(body, "molmo2_image_path", model.weights, inputs, header, policy, call.rows, taps)


def _feeds(inputs: ModelInputs) -> dict[str, np.ndarray]:
    return {
        "pixel_values": np.asarray(inputs["pixel_values"], dtype=np.float32),
        "pooling": np.asarray(inputs["pooling"]).astype(np.int32),  # JAX without x64 lowers indices as i32
    }


def arguments(graph: LoweredGraph, model: EmittedModel, call: Call, inputs: ModelInputs) -> list[np.ndarray]:
    return graph.arguments(model.weights, _feeds(inputs))


def capture_pieces(runtime, call: Call, inputs: ModelInputs, sink: StageSink) -> dict[str, np.ndarray]:
    """The stem, each ViT block (one function for every block), the head, each one ``runtime.call``; taps
    stream out between calls. Returns the projected features for the text side."""
    spec, contract, weights = runtime.model.spec, runtime.contract, runtime.model.weights
    feeds = _feeds(inputs)
    stem = runtime.call(
        "stem",
        functools.partial(stem_graph, spec=spec, contract=contract),
        (
            {k: v for k, v in weights.items() if k.startswith(("vit.patch_embed.", "vit.pos_embed"))},
            feeds["pixel_values"],
        ),
    )
    for stage_id, value in stem.items():
        sink.put(stage_id, value)
    x, outputs = stem["vision.positioned"], []
    for layer in range(spec.execution_depth):
        substages = any(sink.wants(f"vision.block.{layer}.{name}") for name in SUBSTAGES)
        out = runtime.call(
            f"block{'+substages' if substages else ''}",
            functools.partial(block_graph, spec=spec, contract=contract, substages=substages),
            (layer_weights(weights, f"vit.layers.{layer}."), x),
        )
        for name in SUBSTAGES if substages else ():
            sink.put(f"vision.block.{layer}.{name}", out[f"block.{name}"])
        x = out["block.out"]
        sink.put(f"vision.block.{layer}", x)
        outputs.append(x)
    selected = tuple(outputs[layer] for layer in spec.selected_layers)
    for layer, value in zip(spec.selected_layers, selected, strict=True):
        sink.put(f"vision.selected.{layer}", value)
    head = runtime.call(
        "head",
        functools.partial(head_graph, spec=spec, contract=contract),
        ({k: v for k, v in weights.items() if k.startswith(("pool.", "projector."))}, selected, feeds["pooling"]),
    )
    for stage_id, value in head.items():
        sink.put(stage_id, value)
    sink.writer.meta["graph_pieces"] = {"blocks": spec.execution_depth}
    return {FINAL: head[FINAL]}


def text_weights(model: EmittedModel) -> dict[str, np.ndarray]:
    """The decoder's weights, read from the checkpoint once (released with the model)."""
    if model.text is None:
        model.text = model.text_weights = load_weights(model.checkpoint.path, model.spec, parts=("text",))
    return model.text


def capture_text(runtime, inputs: ModelInputs, sink: StageSink, tower: dict[str, np.ndarray]) -> None:
    """The JAX decoder's prefill, the runtime's own features added at the ``<im_patch>`` slots (every layer, the
    last position's logits), then greedy decode step by step against a fixed-capacity key/value cache (left out
    under the runtime option ``decode: false``)."""
    import jax

    from .text import prefill

    text = inputs.text
    spec, weights, contract = runtime.model.spec, text_weights(runtime.model), runtime.contract
    decode = runtime.options.get("decode", True) is not False and sink.wants("text.generate.tokens")
    cache = decode and text.max_new_tokens > 1

    def function(weights, ids, features, types):
        return prefill(weights, ids, features, types, spec=spec, contract=contract, cache=cache)

    args = (
        weights,
        text.input_ids.astype(np.int32),
        np.array(tower[FINAL], dtype=np.float32),  # our own copy: the device reads its arguments in place
        text.mm_token_type_ids.astype(np.int32),
    )
    sink.put("text.input_ids", text.input_ids)
    sink.put("text.token_types", text.mm_token_type_ids)
    out = runtime.run_text(jax.jit(function, keep_unused=True), args)
    keys, values = out.pop("cache.keys", None), out.pop("cache.values", None)
    for stage_id, value in out.items():
        sink.put(stage_id, np.asarray(value))
    if decode:
        step = _decoder(runtime, weights, keys, values, text.max_new_tokens) if cache else None
        put_greedy(sink, np.asarray(out["text.logits.last"]), step, text.max_new_tokens, forced=text.forced)


def _decoder(runtime, weights: dict, keys: np.ndarray, values: np.ndarray, max_new_tokens: int):
    """``step(token) -> logits``: one compiled decode graph whose cache holds the prompt and every generated token
    (capacity fixed up front); the token written at sequence index ``at`` sits at RoPE position ``at``."""
    import jax

    from .text import decode_step

    spec, contract = runtime.model.spec, runtime.contract
    grow = ((0, 0), (0, max_new_tokens - 1), (0, 0), (0, 0))
    state = {"keys": np.pad(keys, grow), "values": np.pad(values, grow), "length": keys.shape[1]}

    def decode(w, k, v, token, at):
        return decode_step(w, k, v, token, at, spec=spec, contract=contract)

    function = jax.jit(decode, keep_unused=True)

    def step(token: int) -> np.ndarray:
        at = state["length"]
        scalars = (np.array([token], np.int32), np.array([at], np.int32))
        out = runtime.run_text(function, (weights, state["keys"], state["values"], *scalars), name="text_decode")
        state.update(keys=np.array(out["keys"]), values=np.array(out["values"]), length=at + 1)  # own copies
        return np.asarray(out["logits"], dtype=np.float32)

    def rewind(count: int) -> None:  # drop the last ``count`` tokens: the graph masks entries past ``at``
        state["length"] -= count

    step.rewind = rewind
    step.cache_snapshot = lambda kind: compiled_cache(state, kind)  # [layers, seq, kv_heads, head_dim] arrays
    return step


def replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """(kind, function, arguments) of one stage: blocks of a kind share the function (weights unprefixed)."""
    if stage_id.startswith("text.") and stage_id != "text.attention_mask":
        return _text_replay_call(model, stage_id, inputs, ctx, contract)
    return replay_function(stage_id, model.spec, contract, model.weights, inputs, ctx)


def _text_replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """A decoder stage: its weights are read from the checkpoint on the first text replay."""
    from .text import text_replay

    kind, function, used = text_replay(stage_id, model.spec, contract, text_weights(model))
    floats: tuple = (np.asarray(inputs[0], dtype=np.float32),)
    side: tuple = ()
    if stage_id.startswith("text.layer."):
        side = (np.asarray(inputs[1]).astype(np.int32),)  # the mask
    elif stage_id == "text.embeds.text":
        floats, side = (), (np.asarray(inputs[0])[~ctx.image_slots].astype(np.int32),)
    elif stage_id == "text.embeds.image":
        side = (ctx.input_ids[ctx.image_slots].astype(np.int32),)
    return kind, function, (used, floats, side)
