"""What the compiled runtimes (``jax``, ``iree``) ask of Qwen3-VL: the emitted model, the packed bucket and
its host stages, the lowered tower (every DeepStack branch an output), its pieces for block-by-block runs,
the text prefill with the DeepStack adds and the greedy decode steps, and the single-stage replay functions."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from driftscope.families.capabilities import CompiledCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.precision import PrecisionPolicy
from driftscope.taps.jax.emitted import EmittedModel
from driftscope.taps.jax.graph import LoweredGraph, contract_for, lower_graph
from driftscope.taps.jax.layers import Contract
from driftscope.taps.sink import StageSink
from driftscope.taps.stages import Stage
from driftscope.taps.substitute import image_rows

from ...qwen_shared.decode import put_decoded, text_model, text_replay_arguments
from ...qwen_shared.mrope import prompt_positions
from ...qwen_shared.text import put_text_inputs
from ..geometry import VisionBucket, interpolation, pack_bucket
from ..plan import deepstack_stage_id, parse_stage
from .model import (
    FINAL,
    SUBSTAGES,
    block_graph,
    final_ids,
    merger_graph,
    stage_function,
    stage_weights,
    stem_graph,
    vision_tower,
)
from .weights import VisionSpec, load_vision_weights

CAPABILITIES = CompiledCapabilities(
    # the text side decodes greedily after the prefill (``text.generate.*``): see :func:`capture_text`
    decodes=True,
    # the text prefill can read another runtime's merged image embeddings (``TextInputs.image_embeds``; the
    # DeepStack features stay this runtime's own)
    substitutes=True,
    # the text decoder holds its own weights (``model.text``) and never reads the tower's: the compiled runtimes
    # drop the tower's while the text side runs (``capture.runtimes.compiled_weights``)
    tower_weights_apart=True,
)
#: Stages computed on the host (inputs and index math), not by the graph.
HOST_STAGES = ("inputs.pixel_values", "inputs.grid_thw", "inputs.image_tokens", "vision.cu_seqlens")
#: What the text side reads of the tower besides the DeepStack branches (the plan's ``meta["tower_outputs"]``
#: names them all; every lowering returns them whatever the taps).
TOWER_OUTPUTS = (FINAL,)
#: Graph inputs after the weights, in call order.
GRAPH_INPUTS = ("pixel_values", "interp_indices", "interp_weights", "positions", "segments")


def load(checkpoint) -> EmittedModel:
    spec = VisionSpec.from_config(checkpoint.config)
    return EmittedModel(spec, load_vision_weights(checkpoint.path, spec), checkpoint)


def bucket(model: EmittedModel, inputs: ModelInputs, rows: int | None) -> VisionBucket:
    return pack_bucket(inputs["grid_thw"], model.spec.grid_side, rows, model.spec.spatial_merge_size)


def put_host_stages(bucket: VisionBucket, sink: StageSink) -> None:
    sink.put("vision.cu_seqlens", bucket.cu_seqlens)


def output_rows(bucket: VisionBucket, stage: Stage) -> int:
    """Rows of a graph output that hold real tokens (the rest is the bucket's padding)."""
    return bucket.active_merged if stage.token_unit == "merged" else bucket.active


def lower(model: EmittedModel, policy: PrecisionPolicy, bucket: VisionBucket, taps: tuple[str, ...]) -> LoweredGraph:
    """The tower for a bucket of ``bucket.rows`` patch rows; weights are arguments, never constants."""
    spec, rows = model.spec, bucket.rows
    taps = tuple(sorted(set(taps)))
    body = functools.partial(vision_tower, spec=spec, contract=contract_for(policy), taps=taps)
    inputs = {
        "pixel_values": ((rows, spec.patch_dim), "float32"),
        "interp_indices": ((rows, 4), "int32"),
        "interp_weights": ((rows, 4), "float32"),
        "positions": ((rows, 2), "int32"),
        "segments": ((rows,), "int32"),
    }
    header = [
        "// driftscope: Qwen3-VL vision tower (driftscope.families.qwen3_vl.jax)",
        f"// bucket rows: {rows}; depth {spec.depth}; DeepStack blocks {list(spec.deepstack_visual_indexes)}",
    ]
    return lower_graph(body, "vision_tower", model.weights, inputs, header, policy, rows, taps)


def _pixels(bucket: VisionBucket, inputs: ModelInputs) -> np.ndarray:
    pixels = np.zeros((bucket.rows, inputs["pixel_values"].shape[1]), dtype=np.float32)
    pixels[: bucket.active] = inputs["pixel_values"]
    return pixels


def arguments(graph: LoweredGraph, model: EmittedModel, bucket: VisionBucket, inputs: ModelInputs) -> list:
    return graph.arguments(model.weights, {"pixel_values": _pixels(bucket, inputs), **bucket.graph_inputs()})


def _prefixed(weights: dict, prefix: str) -> dict:
    return {name[len(prefix) :]: value for name, value in weights.items() if name.startswith(prefix)}


def capture_pieces(runtime, bucket: VisionBucket, inputs: ModelInputs, sink: StageSink) -> dict[str, np.ndarray]:
    """The stem, each block (one function for every block), each DeepStack merger (one function for every
    branch) and the main merger, each one ``runtime.call``; taps stream out between calls. Returns what the
    text side reads (real rows)."""
    spec, contract, weights = runtime.model.spec, runtime.contract, runtime.model.weights
    active, merged = bucket.active, bucket.active_merged
    feeds = bucket.graph_inputs()
    stem_weights = {name: weights[name] for name in ("patch_embed.proj.weight", "patch_embed.proj.bias")}
    stem = runtime.call(
        "stem",
        functools.partial(stem_graph, spec=spec, contract=contract),
        (
            {**stem_weights, "pos_embed.weight": weights["pos_embed.weight"]},
            _pixels(bucket, inputs),
            feeds["interp_indices"],
            feeds["interp_weights"],
            feeds["positions"],
        ),
    )
    for stage_id, value in stem.items():
        sink.put(stage_id, value[:active], bucket_rows=bucket.rows)
    x, cos, sin = stem["vision.positioned"], stem["vision.rotary.cos"], stem["vision.rotary.sin"]
    if "_block_weights" not in runtime.__dict__:  # released with the model
        runtime._block_weights = [_prefixed(weights, f"blocks.{b}.") for b in range(spec.depth)]
    tower: dict[str, np.ndarray] = {}

    def run_merger(prefix: str, stage: str, postshuffle: bool) -> None:
        out = runtime.call(
            f"merger-{'postshuffle' if postshuffle else 'main'}",
            functools.partial(merger_graph, spec=spec, contract=contract, postshuffle=postshuffle),
            (_prefixed(weights, prefix), x),
        )
        for name, value in out.items():
            stage_id = stage + name[len("merger") :]
            rows = active if stage_id == "vision.merger.norm" else merged
            sink.put(stage_id, value[:rows], bucket_rows=bucket.rows)
        tower[stage] = out["merger"][:merged]

    for b in range(spec.depth):
        substages = any(sink.wants(f"vision.block.{b}.{name}") for name in SUBSTAGES)
        out = runtime.call(
            f"block{'+substages' if substages else ''}",
            functools.partial(block_graph, spec=spec, contract=contract, substages=substages),
            (runtime._block_weights[b], x, cos, sin, feeds["segments"]),
        )
        for name in SUBSTAGES if substages else ():
            sink.put(f"vision.block.{b}.{name}", out[f"block.{name}"][:active], bucket_rows=bucket.rows)
        x = out["block.out"]
        sink.put(f"vision.block.{b}", x[:active], bucket_rows=bucket.rows)
        branch = spec.branch(b)
        if branch is not None:
            run_merger(f"deepstack_merger_list.{branch}.", deepstack_stage_id(branch), True)
    run_merger("merger.", FINAL, False)
    return tower


def capture_text(runtime, inputs: ModelInputs, sink: StageSink, tower: dict[str, np.ndarray]) -> None:
    """The JAX text decoder on embeddings merged from the runtime's own tower output, with the runtime's own
    DeepStack features added after the first decoder layers: the prefill (every layer, the last position's
    logits), then greedy decode step by step against a fixed-size key/value cache (left out under the runtime
    option ``decode: false``)."""
    import jax

    from .text import text_decode_step, text_prefill

    text = inputs.text
    spec, weights = _text(runtime.model)
    args, delta = prefill_arguments(runtime, inputs, sink, tower, weights)
    contract = runtime.contract
    decode = runtime.options.get("decode", True) is not False and sink.wants("text.generate.tokens")
    keep = decode and text.max_new_tokens > 1

    def prefill(w, ids, slots, image_embeds, features, pos):
        return text_prefill(w, ids, slots, image_embeds, features, pos, spec=spec, contract=contract, cache=keep)

    out = runtime.run_text(jax.jit(prefill, keep_unused=True), args)
    cache = (out.pop("cache.keys", None), out.pop("cache.values", None))
    for stage_id, value in out.items():
        sink.put(stage_id, np.asarray(value, dtype=np.float32))
    if decode:  # Qwen3-VL's decode step on the shared greedy decoder
        bound = {"spec": spec, "contract": contract}
        put_decoded(runtime, sink, out["text.logits.last"], text, text_decode_step, weights, cache, delta, **bound)


def prefill_arguments(runtime, inputs: ModelInputs, sink: StageSink, tower: dict, weights: dict) -> tuple[tuple, int]:
    """The prefill's arguments (``weights``, the token ids, the image slots, the merged image rows from the
    runtime's own tower output or substituted rows, the DeepStack features, the M-RoPE positions) and the rope
    delta; the prompt's input stages go into ``sink`` on the way."""
    text, vision = inputs.text, runtime.model.spec
    image, positions, delta = prompt_positions(text, inputs["grid_thw"], vision.spatial_merge_size)
    rows = weights["embed_tokens.weight"][text.input_ids]
    embeds = rows.copy()
    merged = image_rows(text, tower[FINAL])  # the tower's output (or substituted rows)
    embeds[image] = merged
    put_text_inputs(inputs, sink, embeds, rows, positions, np.array([delta]))
    branches = [tower[stage] for stage in final_ids(vision)[1:]]  # none without DeepStack (mlx-vlm's test config)
    deepstack = np.stack(branches) if branches else np.zeros((0, *tower[FINAL].shape))
    ids, slots = text.input_ids.astype(np.int32), np.flatnonzero(image).astype(np.int32)
    args = (weights, ids, slots, merged.astype(np.float32), deepstack.astype(np.float32), positions.astype(np.int32))
    return args, int(delta)


def _text(model: EmittedModel):
    """The text decoder's spec and weights, read from the checkpoint once (released with the model)."""
    from .weights import TextSpec, load_text_weights

    return text_model(model, TextSpec, load_text_weights)


def replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """(kind, function, arguments) of one stage: blocks share the function (weights unprefixed), and so do
    the DeepStack mergers; the position table's replay reads the rows and weights the host computes from
    the reference's grids."""
    if stage_id.startswith("text."):
        return _text_replay_call(model, stage_id, inputs, ctx, contract)
    spec = model.spec
    _, _, kind = parse_stage(stage_id)
    if kind == "pos_embed":
        indices, weights = interpolation(inputs[0], spec.grid_side, spec.spatial_merge_size)
        arguments: tuple = (indices.astype(np.int32), weights)
    else:
        arguments = tuple(np.asarray(x, dtype=np.float32) for x in inputs)
    args = (stage_weights(model.weights, stage_id), arguments, ctx.cos, ctx.sin, ctx.segments)
    return kind, stage_function(kind, spec, contract), args


def _text_replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """The decoder's stages (its weights read from the checkpoint on the first text replay); a layer's image rows
    also take the image slots' indices."""
    from .text import text_replay

    spec, weights = _text(model)
    kind, function, used = text_replay(stage_id, weights, spec, contract)
    arguments = text_replay_arguments(stage_id, kind, inputs, ctx)
    return kind, function, (used, arguments, ctx.text_positions.astype(np.int32))
