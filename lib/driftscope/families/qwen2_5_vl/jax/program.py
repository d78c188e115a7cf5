"""What the compiled runtimes (``jax``, ``iree``) ask of Qwen2.5-VL: the emitted model, the packed bucket
and its host stages, the lowered tower, its pieces for block-by-block runs, the text prefill and the
single-stage replay functions."""

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
from ..geometry import Bucket, pack_images
from ..plan import parse_stage
from .model import (
    FINAL,
    SUBSTAGES,
    VisionSpec,
    block_graph,
    load_vision_weights,
    merger_graph,
    prefixed,
    stage_function,
    stage_weights,
    stem_graph,
    vision_tower,
)

CAPABILITIES = CompiledCapabilities(
    # the text side decodes greedily after the prefill (``text.generate.*``): see :func:`capture_text`
    decodes=True,
    # the text prefill can read another runtime's merged image embeddings (``TextInputs.image_embeds``)
    substitutes=True,
    # the tower and the text prefill read only their real rows of a call padded past them (the tower's padding
    # rows are segments of their own, the prefill is causal), so ``options.buckets: pow2`` pads both
    buckets=True,
    # the text decoder holds its own weights (``model.text``) and never reads the tower's: the compiled runtimes
    # drop the tower's while the text side runs (``capture.runtimes.compiled_weights``)
    tower_weights_apart=True,
    # the checkpoint tensors the emitter reads only as dot operands (``linear``, the patch embedding's
    # convolution): held in float16 under a policy whose dots take float16 (``compiled_weights.half_weights``);
    # not a tied head, which is the embedding (a gather)
    dot_weights=(
        "*visual.patch_embed.proj.weight",
        "*visual.blocks.*.attn.qkv.weight",
        "*visual.blocks.*.attn.proj.weight",
        "*visual.blocks.*.mlp.*_proj.weight",
        "*visual.merger.mlp.*.weight",
        "*layers.*.self_attn.*_proj.weight",
        "*layers.*.mlp.*_proj.weight",
        "lm_head.weight",
    ),
)
#: Stages computed on the host (inputs and index math), not by the graph.
HOST_STAGES = (
    "inputs.pixel_values",
    "inputs.grid_thw",
    "inputs.image_tokens",
    "vision.window_index",
    "vision.cu_window_seqlens",
    "vision.cu_seqlens",
)
#: What the text side reads of the tower (the tower function returns it whatever the taps).
TOWER_OUTPUTS = (FINAL,)
#: Graph inputs after the weights, in call order.
GRAPH_INPUTS = ("pixel_values", "patch_gather", "positions", "window_segments", "image_segments", "merged_restore")


def load(checkpoint) -> EmittedModel:
    spec = VisionSpec.from_config(checkpoint.config)
    return EmittedModel(spec, load_vision_weights(checkpoint.path, spec), checkpoint)


def bucket(model: EmittedModel, inputs: ModelInputs, rows: int | None) -> Bucket:
    spec = model.spec
    return pack_images(inputs["grid_thw"], rows, spec.spatial_merge_size, spec.window_size, spec.patch_size)


def put_host_stages(bucket: Bucket, sink: StageSink) -> None:
    sink.put("vision.window_index", bucket.window_index)
    sink.put_bounds("vision.cu_window_seqlens", bucket.cu_window_seqlens_raw)
    sink.put("vision.cu_seqlens", bucket.cu_seqlens)


def output_rows(bucket: Bucket, stage: Stage) -> int:
    """Rows of a graph output that hold real tokens (the rest is the bucket's padding)."""
    return bucket.active_merged if stage.token_unit == "merged" else bucket.active


def lower_vision_tower(
    spec: VisionSpec, policy: PrecisionPolicy, weights: dict, rows: int, taps: tuple[str, ...]
) -> LoweredGraph:
    """The tower for a bucket of ``rows`` patch rows; weights are arguments, never constants."""
    taps = tuple(sorted(set(taps)))
    body = functools.partial(vision_tower, spec=spec, contract=contract_for(policy), taps=taps)
    int32 = "int32"
    inputs = {
        "pixel_values": ((rows, spec.patch_dim), "float32"),
        "patch_gather": ((rows,), int32),
        "positions": ((rows, 2), int32),
        "window_segments": ((rows,), int32),
        "image_segments": ((rows,), int32),
        "merged_restore": ((rows // spec.merge_unit,), int32),
    }
    header = [
        "// driftscope: Qwen2.5-VL vision tower (driftscope.families.qwen2_5_vl.jax)",
        f"// bucket rows: {rows}; depth {spec.depth}; full attention blocks {list(spec.fullatt_block_indexes)}",
    ]
    return lower_graph(body, "vision_tower", weights, inputs, header, policy, rows, taps)


def lower(model: EmittedModel, policy: PrecisionPolicy, bucket: Bucket, taps: tuple[str, ...]) -> LoweredGraph:
    return lower_vision_tower(model.spec, policy, model.weights, bucket.rows, taps)


def _pixels(bucket: Bucket, inputs: ModelInputs) -> np.ndarray:
    pixels = np.zeros((bucket.rows, inputs["pixel_values"].shape[1]), dtype=np.float32)
    pixels[: bucket.active] = inputs["pixel_values"]
    return pixels


def arguments(graph: LoweredGraph, model: EmittedModel, bucket: Bucket, inputs: ModelInputs) -> list[np.ndarray]:
    return graph.arguments(model.weights, {"pixel_values": _pixels(bucket, inputs), **bucket.graph_inputs()})


def capture_pieces(runtime, bucket: Bucket, inputs: ModelInputs, sink: StageSink) -> dict[str, np.ndarray]:
    """The stem, each block (one function for every block), the merger, each one ``runtime.call``; taps
    stream out between calls. Returns the tower's output (raster order, real rows) for the text side."""
    spec, contract, weights = runtime.model.spec, runtime.contract, runtime.model.weights
    active, merged = bucket.active, bucket.active_merged
    feeds = bucket.graph_inputs()
    stem = runtime.call(
        "stem",
        functools.partial(stem_graph, spec=spec, contract=contract),
        (
            {"proj.weight": weights["patch_embed.proj.weight"]},
            _pixels(bucket, inputs),
            feeds["patch_gather"],
            feeds["positions"],
        ),
    )
    for stage_id in ("vision.patch_embed", "vision.rotary.cos", "vision.rotary.sin"):
        sink.put(stage_id, stem[stage_id][:active], bucket_rows=bucket.rows)
    x, cos, sin = stem["x"], stem["cos"], stem["sin"]
    if "_block_weights" not in runtime.__dict__:  # released with the model
        runtime._block_weights = [stage_weights(weights, b, "block") for b in range(spec.depth)]
    block_weights = runtime._block_weights
    for b in range(spec.depth):
        substages = any(sink.wants(f"vision.block.{b}.{name}") for name in SUBSTAGES)
        segments = feeds["image_segments"] if spec.is_full(b) else feeds["window_segments"]
        out = runtime.call(
            f"block{'+substages' if substages else ''}",
            functools.partial(block_graph, spec=spec, contract=contract, substages=substages),
            (block_weights[b], x, cos, sin, segments),
        )
        for name in SUBSTAGES if substages else ():
            sink.put(f"vision.block.{b}.{name}", out[f"block.{name}"][:active], bucket_rows=bucket.rows)
        x = out["block.out"]
        sink.put(f"vision.block.{b}", x[:active], bucket_rows=bucket.rows)
    out = runtime.call(
        "merger",
        functools.partial(merger_graph, spec=spec, contract=contract),
        (prefixed(weights, "merger."), x, feeds["merged_restore"]),
    )
    sink.put("vision.merger.norm", out["vision.merger.norm"][:active], bucket_rows=bucket.rows)
    for stage_id in ("vision.merger.hidden", "vision.merger.window", FINAL):
        sink.put(stage_id, out[stage_id][:merged], bucket_rows=bucket.rows)
    return {FINAL: out[FINAL][:merged]}


def capture_text(runtime, inputs: ModelInputs, sink: StageSink, tower: dict[str, np.ndarray]) -> None:
    """The JAX text decoder on embeddings merged from the runtime's own tower output: the prefill (every layer,
    the last position's logits), then greedy decode step by step against a fixed-size key/value cache (left out
    under the runtime option ``decode: false``)."""
    import jax

    from .text import text_decode_step, text_prefill

    text = inputs.text
    spec, weights = _text(runtime.model)
    rows = weights["embed_tokens.weight"][text.input_ids]
    image, positions, delta = prompt_positions(text, inputs["grid_thw"], runtime.model.spec.spatial_merge_size)
    embeds = rows.copy()
    embeds[image] = image_rows(text, tower[FINAL])  # the tower's raster-order output (or substituted rows)
    put_text_inputs(inputs, sink, embeds, rows, positions, np.array([delta]))
    contract = runtime.contract
    decode = runtime.options.get("decode", True) is not False and sink.wants("text.generate.tokens")

    keep = decode and text.max_new_tokens > 1

    def prefill(w, e, p, *last):
        return text_prefill(w, e, p, *last, spec=spec, contract=contract, cache=keep)

    length = len(embeds)
    padded = runtime.text_length(length)  # a power of two under ``options.buckets: pow2`` (CAPABILITIES.buckets above)
    args = (weights, _pad(embeds.astype(np.float32), padded, 0), _pad(positions.astype(np.int32), padded, 1))
    if padded > length:
        args += (np.array([length - 1], np.int32),)
    out = runtime.run_text(jax.jit(prefill, keep_unused=True), args)
    cache = (out.pop("cache.keys", None), out.pop("cache.values", None))
    for stage_id, value in out.items():
        value = np.asarray(value, dtype=np.float32)
        sink.put(stage_id, value[:length] if value.ndim == 2 and value.shape[0] == padded else value)
    if decode:  # Qwen2.5-VL's decode step on the shared greedy decoder, the cache's padding past ``length`` masked
        last, bound = out["text.logits.last"], {"spec": spec, "contract": contract}
        put_decoded(runtime, sink, last, text, text_decode_step, weights, cache, int(delta), length, **bound)


def _pad(array: np.ndarray, length: int, axis: int) -> np.ndarray:
    """``array`` zero-padded along ``axis`` to ``length`` (the prefill's padded positions, never read back)."""
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, length - array.shape[axis])
    return np.pad(array, widths) if length > array.shape[axis] else array


def replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """(kind, function, arguments) of one stage: blocks of a kind share the function (weights unprefixed)."""
    if stage_id.startswith("text."):
        return _text_replay_call(model, stage_id, inputs, ctx, contract)
    block, kind = parse_stage(stage_id)
    weights = stage_weights(model.weights, block, kind)
    bounds = ctx.bounds(block) if block is not None else np.array([0, len(ctx.cos)])
    segments = np.repeat(np.arange(len(bounds) - 1, dtype=np.int32), np.diff(bounds))
    arguments = tuple(np.asarray(x, dtype=np.float32) for x in inputs)
    if kind in ("rotary.cos", "rotary.sin"):  # the host's positions of the grid's raster rows, as a capture has them
        spec = model.spec
        grid = np.asarray(inputs[0], dtype=np.int64)
        packed = pack_images(grid, None, spec.spatial_merge_size, spec.window_size, spec.patch_size)
        arguments = (packed.positions[: packed.active].astype(np.float32),)
    elif kind == "merger":
        arguments = (arguments[0], np.argsort(ctx.window_index, kind="stable").astype(np.int32))
    args = (weights, arguments, ctx.cos.astype(np.float32), ctx.sin.astype(np.float32), segments)
    return kind, stage_function(kind, model.spec, contract), args


def _text(model: EmittedModel):
    """The text decoder's spec and weights, read from the checkpoint once (released with the model)."""
    from .text import TextSpec, load_text_weights

    return text_model(model, TextSpec, load_text_weights)


def _text_replay_call(model: EmittedModel, stage_id: str, inputs: list[np.ndarray], ctx: Any, contract: Contract):
    """The decoder's stages: its weights are read from the checkpoint on the first text replay."""
    from .text import text_replay

    spec, weights = _text(model)
    kind, function, used = text_replay(stage_id, weights, spec, contract)
    arguments = text_replay_arguments(stage_id, kind, inputs, ctx)
    return kind, function, (used, arguments, ctx.text_positions.astype(np.int32))
