"""What the compiled runtimes (``jax``, ``iree``) ask of Molmo2: the emitted model, the call's shape, the
lowered image path (ViT, selected layers, pooling with the index tensor as an input, projector), its pieces
for block-by-block runs, the text prefill and the single-stage replay functions.

The graph runs the images' exact crops and tokens: no bucket padding, so every stage's rows are real.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.precision import PrecisionPolicy
from driftscope.taps.jax.emitted import EmittedModel
from driftscope.taps.jax.graph import LoweredGraph, contract_for, lower_graph
from driftscope.taps.jax.layers import Contract
from driftscope.taps.sink import StageSink
from driftscope.taps.stages import Stage

from ....errors import ParameterError
from .config import Molmo2Spec
from .model import FINAL, SUBSTAGES, block_graph, head_graph, layer_weights, stem_graph, vision_features
from .stages import replay_function
from .weights import load_weights

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
    return EmittedModel(spec, load_weights(checkpoint.path, spec, parts=("vision",)))


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
        "// driftscope: Molmo2 image path (driftscope.families.molmo2.emitter)",
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


def capture_text(runtime, inputs: ModelInputs, sink: StageSink, tower: dict[str, np.ndarray]) -> None:
    """Prefill logits through the JAX decoder, the runtime's own features added at the ``<im_patch>`` slots."""
    import jax

    from .text import prefill

    text = inputs.text
    spec = runtime.model.spec
    if "_text_weights" not in runtime.__dict__:  # released with the model
        runtime._text_weights = load_weights(runtime.checkpoint.path, spec, parts=("text",))
    contract = runtime.contract

    def function(weights, ids, features, types):
        return prefill(weights, ids, features, types, spec=spec, contract=contract)

    args = (
        runtime._text_weights,
        text.input_ids.astype(np.int32),
        np.array(tower[FINAL], dtype=np.float32),  # our own copy: the device reads its arguments in place
        text.mm_token_type_ids.astype(np.int32),
    )
    sink.put("text.input_ids", text.input_ids)
    sink.put("text.token_types", text.mm_token_type_ids)
    for stage_id, value in runtime.run_text(jax.jit(function, keep_unused=True), args).items():
        sink.put(stage_id, np.asarray(value))


def replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """(kind, function, arguments) of one stage: blocks of a kind share the function (weights unprefixed)."""
    return replay_function(stage_id, model.spec, contract, model.weights, inputs, ctx)
