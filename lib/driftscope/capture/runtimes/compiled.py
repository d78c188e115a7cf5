"""Runtimes that run our own lowered JAX graph: ``jax`` (XLA CPU) and ``iree`` (iree-compile + iree.runtime).

Both lower the same function, the checkpoint family's JAX emitter (its ``emitter.program`` module, a
:class:`~driftscope.capture.runtimes.compiled_taps.CompiledTaps`), for a packed bucket, so a ``jax`` vs
``transformers`` divergence is an emitter effect and an ``iree`` vs ``jax`` one a compiler/runtime effect. The
whole tower is one graph whose outputs are the selected taps: the production-like graph is the same function
lowered with only the tower's output as output (``taps: final``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.capture.load_audit import audit_later_part, tensors_of
from driftscope.capture.runtimes.base import Runtime, package_versions, require
from driftscope.capture.runtimes.compiled_taps import Bucket, CompiledTaps, padded_length
from driftscope.capture.runtimes.compiled_weights import drop_tower, refuse_unread, restore_tower, weight_reads
from driftscope.capture.runtimes.jax_cache import use_persistent_cache
from driftscope.errors import ParameterError
from driftscope.families.capabilities import CompiledCapabilities, capabilities_of
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.quant.policy import RUNTIME_POLICIES
from driftscope.taps.jax.contract import Contract
from driftscope.taps.jax.graph import LoweredGraph, contract_for
from driftscope.taps.sink import StageSink

COMPILED_POLICIES = ("f32", "f16-contract", "f16-state")
#: "whole": the tower as one graph whose outputs are the selected taps; "blocks": the family's pieces (e.g. a
#: stem, one function per block, the same compiled artifact for every block, a head), with the taps streamed
#: out between calls; "auto" (default): whole while its tapped outputs fit ``options.whole_taps_mib``, else
#: blocks (memory stays bounded by the model plus one block's taps however many substages are tapped)
GRAPH_MODES = ("auto", "whole", "blocks")
#: Runtime options: ``graph`` (above), ``whole_taps_mib``, ``target`` and ``flags`` (iree), ``cache_dir``, and
#: ``decode`` (default true: the text side decodes greedily where the family's emitter can; false: prefill only).
#: Default budget for the tapped outputs a whole graph holds at once before ``auto`` goes block by block.
WHOLE_TAPS_MIB = 512


class CompiledRuntime(Runtime):
    OPTIONS = {
        "graph": "auto (default), whole or blocks: how the tower is lowered",
        "whole_taps_mib": f"MiB of tapped outputs a whole graph may hold before auto goes by blocks ({WHOLE_TAPS_MIB})",
        "bucket": "the rows of a packed call (default: the inputs' own)",
        "taps": "final: return only the tower's output (a plain forward)",
        "decode": "false: run the text side's prefill only (default true: decode greedily where the family can)",
        "buckets": "pow2: pad the tower's rows and the text prefill to the next power of two where the family's "
        "emitter can (its buckets capability), so one compiled graph serves every input of a bucket (the screen "
        "sets it); exact (default): each input's own sizes",
        "f32": "stages whose operators compute in float32 under a half-precision policy (model.mixed; e.g. "
        "[vision.block.17-31.norm2]): compiled into the StableHLO, whole-graph only",
    }
    OPTION_VALUES = {"graph": GRAPH_MODES, "decode": (True, False), "buckets": ("exact", "pow2"), "taps": ("final",)}
    OPTION_TYPES = {"whole_taps_mib": "positive number", "bucket": "positive whole number", "f32": "list of texts"}
    policies = (*COMPILED_POLICIES, *RUNTIME_POLICIES["jax"])  # q4-dequant: the dense dequantized checkpoint
    ENGINE_MODULE = CompiledTaps
    CAPABILITIES = CompiledCapabilities
    #: whether :func:`~driftscope.capture.runtimes.compiled_weights.drop_tower` dropped the tower's weights
    tower_dropped: bool = False

    def __init__(self, checkpoint, policy: str = "f32", patch=None, options: dict | None = None):
        super().__init__(checkpoint, policy, patch, options)
        if self.options.get("f32"):  # a mixed policy: those operators in float32 (model.mixed)
            self.policy = self.mixed_policy()

    def _load(self) -> Any:
        require("jax", "jax", self.name, self.EXTRA)
        self._read: set[str] = set()
        with weight_reads(self):  # recorded; dot-only weights in float16 under f16-contract
            model = self.taps.load(self.checkpoint)
        self.refuse_unread(text=False)
        return model

    def refuse_unread(self, text: bool) -> None:
        refuse_unread(self, text)

    def loaded_tensors(self) -> dict:
        """The weights the emitter read at load (the tower's; the text side's are read, and audited, at the text
        capture), as the program receives them."""
        return tensors_of(self.model.weights if isinstance(getattr(self.model, "weights", None), dict) else {})

    def weight_dtypes(self) -> dict[str, int]:
        from collections import Counter

        restore_tower(self)
        return dict(Counter(str(array.dtype) for array in self.model.weights.values()))

    @property
    def contract(self) -> Contract:
        return contract_for(self.policy)

    def bucket(self, inputs: ModelInputs) -> Bucket:
        rows = self.options.get("bucket")
        if rows is not None and not isinstance(rows, int):
            raise ParameterError(f"options.bucket must be an integer row count, got {rows!r}", "write e.g. bucket: 256")
        if rows is None and self.pads:
            exact = self.taps.bucket(self.model, inputs, None)
            rows = padded_length(exact.rows, exact.merge_unit)
        return self.taps.bucket(self.model, inputs, rows)

    @property
    def pads(self) -> bool:
        """Whether inputs are padded to power-of-two buckets (``options.buckets: pow2`` and a family emitter whose
        ``buckets`` capability says its tower and text prefill read only their real rows of a padded call)."""
        return self.options.get("buckets") == "pow2" and self.capabilities.buckets

    def text_length(self, length: int) -> int:
        """The text prefill's sequence length for a prompt of ``length`` tokens (padded under :attr:`pads`)."""
        return padded_length(length) if self.pads else length

    def graph_taps(self, wanted: list[str]) -> tuple[str, ...]:
        if self.options.get("taps") == "final":
            return (self.taps.FINAL,)
        return tuple(s for s in wanted if s not in self.taps.HOST_STAGES)

    def lower(self, bucket: Bucket, taps: tuple[str, ...]) -> LoweredGraph:
        start = time.perf_counter()
        graph = self.taps.lower(self.model, self.policy, bucket, taps)
        self.timings["lower_s"] = time.perf_counter() - start
        return graph

    def arguments(self, graph: LoweredGraph, bucket: Bucket, inputs: ModelInputs) -> list[np.ndarray]:
        return self.taps.arguments(graph, self.model, bucket, inputs)

    def execute(self, graph: LoweredGraph, arguments: list[np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def release(self) -> None:
        for name in ("_pieces", "_device_weights", "_block_weights", "_text_weights", "_tower", "tower_dropped"):
            self.__dict__.pop(name, None)
        super().release()

    @property
    def graph_mode(self) -> str:
        return str(self.options.get("graph", "auto"))  # one of GRAPH_MODES: ``check_options`` saw to it

    def call(self, name: str, function, args: tuple) -> dict[str, np.ndarray]:
        """Run one piece (e.g. stem, block, head) of the block-by-block path; ``args[0]`` holds its weights."""
        raise NotImplementedError

    def _capture_blocks(self, inputs: ModelInputs, sink: StageSink, bucket: Bucket) -> None:
        """One call per piece of the family's tower (e.g. stem, each block, the head); taps stream out."""
        start = time.perf_counter()
        self._tower = self.taps.capture_pieces(self, bucket, inputs, sink)
        self.timings["run_s"] = time.perf_counter() - start - self.timings.get("compile_s", 0.0)
        sink.writer.meta["bucket"] = {"rows": bucket.rows, "active_rows": bucket.active_rows}
        sink.writer.meta["graph"] = {"mode": "blocks", "requested": self.graph_mode}

    def _capture(self, inputs: ModelInputs, sink: StageSink) -> None:
        restore_tower(self)  # dropped by an earlier capture's text side
        bucket = self.bucket(inputs)
        self.put_inputs(inputs, sink)
        self.taps.put_host_stages(bucket, sink)
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
        if mode == "blocks" and self.policy.f32:
            raise ParameterError(
                f"{self.label}: operators kept in float32 (options.f32) are compiled into the whole graph only, and "
                "this one runs block by block (one compiled block shared by every block of a kind)",
                "set options.graph: whole (and raise options.whole_taps_mib if auto chose blocks)",
            )
        if mode == "blocks":
            self.timings["compile_s"] = 0.0
            self._capture_blocks(inputs, sink, bucket)
            return
        outputs = self.execute(graph, self.arguments(graph, bucket, inputs))
        plan = self.family.plan_for(self.checkpoint)  # the whole plan: the selection may leave them out
        self._tower = {
            stage: outputs[stage][: self.taps.output_rows(bucket, plan[stage])]
            for stage in plan.meta.get("tower_outputs") or self.taps.TOWER_OUTPUTS
            if stage in outputs
        }
        start = time.perf_counter()
        for stage in sink.plan:
            if stage.id in outputs:
                sink.put(stage.id, outputs[stage.id][: self.taps.output_rows(bucket, stage)], bucket_rows=bucket.rows)
        self.timings["write_s"] = time.perf_counter() - start
        sink.writer.meta["bucket"] = {"rows": bucket.rows, "active_rows": bucket.active_rows}
        sink.writer.meta["graph"] = {
            "mode": "whole",
            "requested": self.graph_mode,
            "stablehlo_digest": graph.digest,
            "taps": len(graph.taps),
            "outputs": len(graph.output_names),
        }

    @property
    def can_replay(self) -> bool:
        """Not under a mixed policy: a replayed operator is compiled once per kind, for every block of it."""
        return not self.policy.f32

    @classmethod
    def decodes_with(cls, family: str) -> bool:
        """The family's emitter decodes when its program module declares it (the ``decodes`` capability)."""
        from driftscope.families import get_family

        return capabilities_of(get_family(family).engine(cls.name), cls.CAPABILITIES).decodes

    @property
    def substitutes(self) -> bool:
        """The family's emitter takes another runtime's merged image embeddings when its program module says
        so (the ``substitutes`` capability: the prefill reads ``TextInputs.image_embeds`` at the image slots)."""
        return self.capabilities.substitutes

    def _capture_text(self, inputs: ModelInputs, sink: StageSink) -> None:
        """The family's JAX text decoder on embeddings merged from this runtime's own tower output; then every
        tensor of the checkpoint must have been read."""
        drop_tower(self)  # the text side never reads the tower's weights (where the family keeps them apart)
        with weight_reads(self):
            self.taps.capture_text(self, inputs, sink, self._tower)
        self.refuse_unread(text=True)
        audit_later_part(self, "text", tensors_of(self.model.text_weights or {}))

    def run_text(self, function, args, name: str = "text_prefill") -> dict[str, np.ndarray]:
        """One text graph (``name``: the prefill, a decode step) on ``args`` (weights first)."""
        return {k: np.asarray(v) for k, v in function(*args).items()}

    def replay_call(self, stage_id: str, inputs: list[np.ndarray], ctx: Any):
        """(jitted function, arguments) of one stage, for the jax and iree runtimes: one function per stage
        kind, so the blocks of a kind share one jit and one compiled artifact."""
        self.load()
        if not stage_id.startswith("text."):
            restore_tower(self)
        with weight_reads(self):  # the text side's weights are read at its first replay
            kind, function, args = self.taps.replay_call(self.model, stage_id, inputs, ctx, self.contract)
        cache = self.__dict__.setdefault("_replay_functions", {})
        if kind not in cache:
            import jax

            def call(*args, function=function):
                return function(*args)

            call.__name__ = f"replay_{kind.replace('.', '_')}_{self.policy.name.replace('-', '_')}"
            cache[kind] = jax.jit(call, keep_unused=True)
        return cache[kind], args


class JaxRuntime(CompiledRuntime):
    """The lowered graph on JAX's own XLA CPU backend."""

    name = "jax"
    REQUIRES = {"jax": "jax", "jaxlib": "jaxlib"}
    EXTRA = "jax"

    def _load(self) -> Any:
        model = super()._load()
        use_persistent_cache(self.options.get("cache_dir"))
        return model

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
    REQUIRES = {"jax": "jax", "iree.compiler": "iree-base-compiler", "iree.runtime": "iree-base-runtime"}
    EXTRA = "iree"
    OPTIONS = {
        **CompiledRuntime.OPTIONS,
        "target": "iree-compile's target backend (default llvm-cpu)",
        "flags": "more iree-compile flags (a list)",
        "cache_dir": "where compiled artifacts are cached (default: $DRIFTSCOPE_CACHE, else the user cache folder)",
    }
    OPTION_TYPES = {**CompiledRuntime.OPTION_TYPES, "target": "text", "flags": "list of texts", "cache_dir": "text"}

    def versions(self) -> dict[str, str]:
        return package_versions("jax", "iree-base-compiler", "iree-base-runtime")

    @property
    def target(self) -> str:
        return str(self.options.get("target", "llvm-cpu"))

    def compile(self, graph: LoweredGraph):
        """The cached artifact of ``graph`` for this runtime's target, flags and cache directory."""
        from driftscope.capture.iree import compile_graph

        cache = self.options.get("cache_dir")
        artifact = compile_graph(
            graph, self.target, Path(cache) if cache else None, tuple(self.options.get("flags", ()))
        )
        self.artifact = artifact
        return artifact

    def device_weights(self):
        """This runtime's weights on its device, put there once (released with the model)."""
        from driftscope.capture.iree import DeviceWeights, target_flags

        if "_device_weights" not in self.__dict__:
            self._device_weights = DeviceWeights(target_flags(self.target)[1])
        return self._device_weights

    def execute(self, graph: LoweredGraph, arguments: list[np.ndarray]) -> dict[str, np.ndarray]:
        require("iree.runtime", "iree-base-runtime", self.name, self.EXTRA)
        from driftscope.capture.iree import IreeModule

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

    def _capture(self, inputs: ModelInputs, sink: StageSink) -> None:
        super()._capture(inputs, sink)
        sink.writer.meta["artifact"] = self.artifact.to_dict()

    def call(self, name: str, function, args: tuple) -> dict[str, np.ndarray]:
        """Lower and compile each piece once per shape (cached artifacts); weights stay on the device."""
        import jax

        from driftscope.capture.iree import IreeModule
        from driftscope.taps.jax.graph import lower_function

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

    def run_text(self, function, args, name: str = "text_prefill") -> dict[str, np.ndarray]:
        """A text graph (the prefill, a decode step) lowered on its own and compiled by iree-compile (cached like
        the tower; a decode step's graph once for every step, its shapes do not change)."""
        return self.call(name, function, args)

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """The stage lowered on its own and compiled by iree-compile (one cached artifact per stage kind)."""
        jitted, args = self.replay_call(stage_id, inputs, ctx)
        return np.asarray(self.call(jitted.__name__, jitted, args)["output"], dtype=np.float32)
