"""Runtimes that run our own lowered JAX graph: ``jax`` (XLA CPU) and ``iree`` (iree-compile + iree.runtime).

Both lower the same function (``driftscope.compiled.graph``) for a packed bucket, so a ``jax`` vs
``transformers`` divergence is an emitter effect and an ``iree`` vs ``jax`` one a compiler/runtime
effect. The whole tower is one graph whose outputs are the selected taps: the production-like
graph is the same function lowered with only ``vision.merger`` as output (``taps: final``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..compiled.graph import LoweredGraph, contract_for, lower_vision_tower
from ..emitters.qwen2_5_vl import VisionSpec, load_vision_weights
from ..emitters.qwen2_5_vl.model import FINAL
from ..errors import ParameterError
from ..geometry import Bucket, pack_images
from ..inputs import VisionInputs
from .base import Runtime, StageSink, package_versions, require

#: Stages computed on the host (index math), not by the graph.
HOST_STAGES = (
    "inputs.pixel_values",
    "inputs.grid_thw",
    "inputs.image_tokens",
    "vision.window_index",
    "vision.cu_window_seqlens",
    "vision.cu_seqlens",
)
COMPILED_POLICIES = ("f32", "f16-contract", "f16-state")
#: "whole": the tower as one graph whose outputs are the selected taps; "blocks": stem, one function per block
#: (the same compiled artifact for every block), merger, with the taps streamed out between calls; "auto"
#: (default): whole while its tapped outputs fit ``options.whole_taps_mib``, else blocks (memory stays
#: bounded by the model plus one block's taps however many substages are tapped)
GRAPH_MODES = ("auto", "whole", "blocks")
#: Default budget for the tapped outputs a whole graph holds at once before ``auto`` goes block by block.
WHOLE_TAPS_MIB = 512


@dataclass
class EmittedModel:
    """What a hypothesis patch receives for the compiled runtimes: the spec and the float32 weights."""

    spec: VisionSpec
    weights: dict[str, np.ndarray]


class CompiledRuntime(Runtime):
    policies = COMPILED_POLICIES

    def _load(self) -> Any:
        require("jax", "jax", self.name)
        spec = VisionSpec.from_config(self.checkpoint.config)
        return EmittedModel(spec, load_vision_weights(self.checkpoint.path, spec))

    def weight_dtypes(self) -> dict[str, int]:
        from collections import Counter

        return dict(Counter(str(array.dtype) for array in self.model.weights.values()))

    def bucket(self, inputs: VisionInputs) -> Bucket:
        spec = self.model.spec
        rows = self.options.get("bucket")
        if rows is not None and not isinstance(rows, int):
            raise ParameterError(f"options.bucket must be an integer row count, got {rows!r}", "write e.g. bucket: 256")
        return pack_images(inputs.grid_thw, rows, spec.spatial_merge_size, spec.window_size, spec.patch_size)

    def graph_taps(self, wanted: list[str]) -> tuple[str, ...]:
        if self.options.get("taps") == "final":
            return (FINAL,)
        return tuple(s for s in wanted if s not in HOST_STAGES)

    def lower(self, bucket: Bucket, taps: tuple[str, ...]) -> LoweredGraph:
        start = time.perf_counter()
        graph = lower_vision_tower(self.model.spec, self.policy, self.model.weights, bucket.rows, taps)
        self.timings["lower_s"] = time.perf_counter() - start
        return graph

    def arguments(self, graph: LoweredGraph, bucket: Bucket, inputs: VisionInputs) -> list[np.ndarray]:
        pixels = np.zeros((bucket.rows, inputs.pixel_values.shape[1]), dtype=np.float32)
        pixels[: bucket.active] = inputs.pixel_values
        return graph.arguments(self.model.weights, {"pixel_values": pixels, **bucket.graph_inputs()})

    def execute(self, graph: LoweredGraph, arguments: list[np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def release(self) -> None:
        for name in ("_pieces", "_device_weights", "_block_weights", "_text_weights", "_merged"):
            self.__dict__.pop(name, None)
        super().release()

    @property
    def graph_mode(self) -> str:
        mode = str(self.options.get("graph", "auto"))
        if mode not in GRAPH_MODES:
            raise ParameterError(f"options.graph={mode!r} is not known", f"use one of: {', '.join(GRAPH_MODES)}")
        return mode

    def call(self, name: str, function, args: tuple) -> dict[str, np.ndarray]:
        """Run one piece (stem, block, merger) of the block-by-block path; ``args[0]`` holds its weights."""
        raise NotImplementedError

    def _capture_blocks(self, inputs: VisionInputs, sink: StageSink, bucket: Bucket) -> None:
        """One call per piece: the stem, each block (one function for every block), the merger; taps stream out."""
        import functools

        from ..emitters.qwen2_5_vl.model import SUBSTAGES, block_graph, merger_graph, stem_graph
        from ..emitters.qwen2_5_vl.stages import stage_weights

        spec, contract, weights = self.model.spec, contract_for(self.policy), self.model.weights
        active, merged = bucket.active, bucket.active_merged
        pixels = np.zeros((bucket.rows, inputs.pixel_values.shape[1]), dtype=np.float32)
        pixels[:active] = inputs.pixel_values
        feeds = bucket.graph_inputs()
        start = time.perf_counter()
        stem = self.call(
            "stem",
            functools.partial(stem_graph, spec=spec, contract=contract),
            ({"proj.weight": weights["patch_embed.proj.weight"]}, pixels, feeds["patch_gather"], feeds["positions"]),
        )
        for stage_id in ("vision.patch_embed", "vision.rotary.cos", "vision.rotary.sin"):
            sink.put(stage_id, stem[stage_id][:active], bucket_rows=bucket.rows)
        x, cos, sin = stem["x"], stem["cos"], stem["sin"]
        if not hasattr(self, "_block_weights"):
            self._block_weights = [stage_weights(weights, b, "block") for b in range(spec.depth)]
        for b in range(spec.depth):
            substages = any(sink.wants(f"vision.block.{b}.{name}") for name in SUBSTAGES)
            segments = feeds["image_segments"] if spec.is_full(b) else feeds["window_segments"]
            out = self.call(
                f"block{'+substages' if substages else ''}",
                functools.partial(block_graph, spec=spec, contract=contract, substages=substages),
                (self._block_weights[b], x, cos, sin, segments),
            )
            for name in SUBSTAGES if substages else ():
                sink.put(f"vision.block.{b}.{name}", out[f"block.{name}"][:active], bucket_rows=bucket.rows)
            x = out["block.out"]
            sink.put(f"vision.block.{b}", x[:active], bucket_rows=bucket.rows)
        out = self.call(
            "merger",
            functools.partial(merger_graph, spec=spec, contract=contract),
            (stage_weights(weights, None, "merger"), x, feeds["merged_restore"]),
        )
        sink.put("vision.merger.norm", out["vision.merger.norm"][:active], bucket_rows=bucket.rows)
        for stage_id in ("vision.merger.hidden", "vision.merger.window", FINAL):
            sink.put(stage_id, out[stage_id][:merged], bucket_rows=bucket.rows)
        self._merged = out[FINAL][:merged]
        self.timings["run_s"] = time.perf_counter() - start - self.timings.get("compile_s", 0.0)
        sink.writer.meta["bucket"] = {"rows": bucket.rows, "active_rows": bucket.active_rows}
        sink.writer.meta["graph"] = {"mode": "blocks", "requested": self.graph_mode}

    def _capture(self, inputs: VisionInputs, sink: StageSink) -> None:
        bucket = self.bucket(inputs)
        self.put_inputs(inputs, sink)
        sink.put("vision.window_index", bucket.window_index)
        sink.put_bounds("vision.cu_window_seqlens", bucket.cu_window_seqlens_raw)
        sink.put("vision.cu_seqlens", bucket.cu_seqlens)
        self._say = sink.progress or (lambda message: None)
        mode = self.graph_mode
        if mode != "blocks":
            wanted = [stage.id for stage in sink.plan if sink.wants(stage.id)]
            graph = self.lower(bucket, self.graph_taps(wanted))
            self._say(
                f"lowered to StableHLO ({len(graph.output_names)} outputs, {graph.output_bytes / 2**20:.0f} MiB, "
                f"bucket {bucket.rows} rows, {bucket.active} active) in {self.timings['lower_s']:.1f}s"
            )
            budget = float(self.options.get("whole_taps_mib", WHOLE_TAPS_MIB))
            if mode == "auto" and graph.output_bytes > budget * 2**20:
                self._say(f"tapped outputs exceed whole_taps_mib={budget:g}: running block by block")
                mode = "blocks"
        if mode == "blocks":
            self.timings["compile_s"] = 0.0
            self._capture_blocks(inputs, sink, bucket)
            return
        outputs = self.execute(graph, self.arguments(graph, bucket, inputs))
        self._merged = outputs.get(FINAL)[: bucket.active_merged] if FINAL in outputs else None
        start = time.perf_counter()
        for stage in sink.plan:
            if stage.id in outputs:
                rows = bucket.active_merged if stage.token_unit == "merged" else bucket.active
                sink.put(stage.id, outputs[stage.id][:rows], bucket_rows=bucket.rows)
        self.timings["write_s"] = time.perf_counter() - start
        sink.writer.meta["bucket"] = {"rows": bucket.rows, "active_rows": bucket.active_rows}
        sink.writer.meta["graph"] = {
            "mode": "whole",
            "requested": self.graph_mode,
            "stablehlo_digest": graph.digest,
            "taps": len(graph.taps),
            "outputs": len(graph.output_names),
        }

    can_replay = True

    def _capture_text(self, inputs: VisionInputs, sink: StageSink) -> None:
        """Prefill logits through our JAX text decoder on embeddings merged from this runtime's own tower."""
        import jax

        from ..emitters.qwen2_5_vl.text import TextSpec, load_text_weights, text_prefill
        from ..geometry import mrope_positions

        text = inputs.text
        spec = TextSpec.from_config(self.checkpoint.config)
        if not hasattr(self, "_text_weights"):
            self._text_weights = load_text_weights(self.checkpoint.path, spec)
        weights = self._text_weights
        rows = weights["embed_tokens.weight"][text.input_ids]
        image = text.input_ids == text.image_token_id
        embeds = rows.copy()
        embeds[image] = self._merged  # the tower's raster-order output, image after image
        positions, delta = mrope_positions(
            image.astype(int).tolist(), inputs.grid_thw.tolist(), self.model.spec.spatial_merge_size
        )
        self.put_text_inputs(inputs, sink, embeds, rows, positions, np.array([delta]))
        function = jax.jit(
            lambda w, e, p: text_prefill(w, e, p, spec=spec, contract=contract_for(self.policy)), keep_unused=True
        )
        args = (weights, embeds.astype(np.float32), positions.astype(np.int32))
        for stage_id, value in self.run_text(function, args).items():
            sink.put(stage_id, np.asarray(value, dtype=np.float32))

    def run_text(self, function, args) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in function(*args).items()}

    def replay_call(self, stage_id: str, inputs: list[np.ndarray], ctx: Any):
        """(function, weights, flat arguments) of one stage, for the jax and iree runtimes."""
        from ..emitters.qwen2_5_vl.stages import stage_function, stage_weights
        from ..replay.context import parse_stage

        self.load()
        block, kind = parse_stage(stage_id)
        weights = stage_weights(self.model.weights, block, kind)
        bounds = ctx.bounds(block) if block is not None else np.array([0, len(ctx.cos)])
        segments = np.repeat(np.arange(len(bounds) - 1, dtype=np.int32), np.diff(bounds))
        cache = self.__dict__.setdefault("_replay_functions", {})
        if kind not in cache:  # one jitted function per stage kind: blocks of a kind share its compilation
            import jax

            function = stage_function(kind, self.model.spec, contract_for(self.policy))

            def call(weights, arguments, cos, sin, segments, function=function):
                return function(weights, arguments, cos, sin, segments)

            call.__name__ = f"replay_{kind.replace('.', '_')}_{self.policy.name.replace('-', '_')}"
            cache[kind] = jax.jit(call, keep_unused=True)
        arguments = tuple(np.asarray(x, dtype=np.float32) for x in inputs)
        return cache[kind], (weights, arguments, ctx.cos.astype(np.float32), ctx.sin.astype(np.float32), segments)


class JaxRuntime(CompiledRuntime):
    """The lowered graph on JAX's own XLA CPU backend."""

    name = "jax"

    def call(self, name: str, function, args: tuple) -> dict[str, np.ndarray]:
        import jax

        jitted = self.__dict__.setdefault("_pieces", {})
        if name not in jitted:
            jitted[name] = jax.jit(function, keep_unused=True)
        return {k: np.asarray(v) for k, v in jax.block_until_ready(jitted[name](*args)).items()}

    def versions(self) -> dict[str, str]:
        return package_versions("jax", "jaxlib")

    def execute(self, graph: LoweredGraph, arguments: list[np.ndarray]) -> dict[str, np.ndarray]:
        import jax

        start = time.perf_counter()
        compiled = graph.lowered.compile()
        self.timings["compile_s"] = time.perf_counter() - start
        weights = dict(zip(sorted(self.model.weights), arguments[: len(self.model.weights)], strict=True))
        start = time.perf_counter()
        out = compiled(weights, *arguments[len(self.model.weights) :])
        out = jax.block_until_ready(out)
        self.timings["run_s"] = time.perf_counter() - start
        return {name: np.asarray(value) for name, value in out.items()}

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        import jax

        jitted, args = self.replay_call(stage_id, inputs, ctx)
        return np.asarray(jax.block_until_ready(jitted(*args)), dtype=np.float32)


class IreeRuntime(CompiledRuntime):
    """The lowered graph compiled by iree-compile (target ``options.target``, default llvm-cpu), run by iree.runtime."""

    name = "iree"

    def versions(self) -> dict[str, str]:
        return package_versions("jax", "iree-base-compiler", "iree-base-runtime")

    @property
    def target(self) -> str:
        return str(self.options.get("target", "llvm-cpu"))

    def compile(self, graph: LoweredGraph):
        """The cached artifact of ``graph`` for this runtime's target, flags and cache directory."""
        from ..compiled.iree import compile_graph

        cache = self.options.get("cache_dir")
        artifact = compile_graph(
            graph, self.target, Path(cache) if cache else None, tuple(self.options.get("flags", ()))
        )
        self.artifact = artifact
        return artifact

    def device_weights(self):
        """This runtime's weights on its device, put there once (released with the model)."""
        from ..compiled.iree import DeviceWeights, target_flags

        if "_device_weights" not in self.__dict__:
            self._device_weights = DeviceWeights(target_flags(self.target)[1])
        return self._device_weights

    def execute(self, graph: LoweredGraph, arguments: list[np.ndarray]) -> dict[str, np.ndarray]:
        require("iree.runtime", "iree-base-runtime", self.name)
        from ..compiled.iree import IreeModule

        self._say(f"iree-compile ({self.target}) unless the artifact is cached")
        artifact = self.compile(graph)
        self.timings["compile_s"] = artifact.compile_s
        self._say(
            f"artifact {artifact.key}: "
            + (
                "loaded from the cache"
                if artifact.cache_hit
                else f"compiled by iree-compile in {artifact.compile_s:.1f}s"
            )
        )
        start = time.perf_counter()
        module = IreeModule(artifact, graph.output_names)
        self.timings["module_load_s"] = time.perf_counter() - start
        device = self.device_weights()
        count = len(self.model.weights)  # weights first (sorted by name): on the device once, passed by reference
        arguments = [device(a) for a in arguments[:count]] + list(arguments[count:])
        start = time.perf_counter()
        out = module(arguments)
        self.timings["run_s"] = time.perf_counter() - start
        return out

    def _capture(self, inputs: VisionInputs, sink: StageSink) -> None:
        super()._capture(inputs, sink)
        sink.writer.meta["artifact"] = self.artifact.to_dict()

    def call(self, name: str, function, args: tuple) -> dict[str, np.ndarray]:
        """Lower and compile each piece once per shape (cached artifacts); weights stay on the device."""
        import jax

        from ..compiled.graph import lower_function
        from ..compiled.iree import IreeModule

        shapes = tuple((tuple(np.shape(a)), str(np.asarray(a).dtype)) for a in jax.tree_util.tree_leaves(args[1:]))
        modules = self.__dict__.setdefault("_pieces", {})
        key = (name, shapes)
        if key not in modules:
            jitted = function if hasattr(function, "lower") else jax.jit(function, keep_unused=True)
            graph = lower_function(jitted, args, self.policy)
            artifact = self.compile(graph)
            self.timings["compile_s"] = self.timings.get("compile_s", 0.0) + artifact.compile_s
            modules[key] = IreeModule(artifact, graph.output_names)
        device = self.device_weights()
        leaves = [device(w) for w in jax.tree_util.tree_leaves(args[0])] + jax.tree_util.tree_leaves(args[1:])
        return modules[key](leaves)

    def run_text(self, function, args) -> dict[str, np.ndarray]:
        """The text prefill lowered on its own and compiled by iree-compile (cached like the tower)."""
        return self.call("text_prefill", function, args)

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """The stage lowered on its own and compiled by iree-compile (one cached artifact per stage kind)."""
        jitted, args = self.replay_call(stage_id, inputs, ctx)
        return np.asarray(self.call(jitted.__name__, jitted, args)["output"], dtype=np.float32)
