"""What a family's compiled-path module (``families/<family>/emitter/program.py``) tells the ``jax`` and ``iree``
runtimes (:class:`CompiledTaps`), the packed call it plans (:class:`Bucket`) and the power-of-two padding that lets
one compiled graph serve every input of a bucket (``options.buckets: pow2``)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from driftscope.families.capabilities import CompiledCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.precision import PrecisionPolicy
from driftscope.taps.jax.contract import Contract
from driftscope.taps.jax.emitted import EmittedModel
from driftscope.taps.jax.graph import LoweredGraph
from driftscope.taps.sink import StageSink
from driftscope.taps.stages import Stage


def padded_length(length: int, unit: int = 1) -> int:
    """``length`` rounded up to the next power of two, then to a multiple of ``unit``."""
    rows = 1 << max(int(length) - 1, 0).bit_length()
    return rows + (-rows % unit)


class Bucket(Protocol):
    """A family's host-side plan of one packed call: ``rows`` in the bucket, which of them are real."""

    rows: int
    active_rows: list[list[int]]
    # ``merge_unit: int``, the rows a padded call is a multiple of, of a family that declares ``buckets``


@runtime_checkable
class CompiledTaps(Protocol):
    """What a family tells this engine (module-level names of ``families/<family>/emitter/program.py``)."""

    HOST_STAGES: tuple[str, ...]  # stages computed on the host (inputs, index math), not by the graph
    FINAL: str  # the tower's output: what the production graph returns
    CAPABILITIES: CompiledCapabilities  # what else it declares (decoding, substitution, padding, weights)
    TOWER_OUTPUTS: tuple[str, ...]  # graph outputs the text side reads (every lowering returns them), unless
    # the family's plan names them in ``meta["tower_outputs"]`` (when they depend on the config)

    def load(self, checkpoint: Any) -> EmittedModel: ...

    def bucket(self, model: EmittedModel, inputs: ModelInputs, rows: int | None) -> Bucket: ...

    def put_host_stages(self, bucket: Bucket, sink: StageSink) -> None: ...

    def lower(self, model: EmittedModel, policy: PrecisionPolicy, bucket: Bucket, taps: tuple) -> LoweredGraph: ...

    def arguments(self, graph: LoweredGraph, model: EmittedModel, bucket: Bucket, inputs: ModelInputs) -> list: ...

    def output_rows(self, bucket: Bucket, stage: Stage) -> int: ...

    # ``runtime``: the calling :class:`~driftscope.capture.runtimes.compiled.CompiledRuntime` (not imported: it
    # imports this module)
    def capture_pieces(self, runtime: Any, bucket: Bucket, inputs: ModelInputs, sink: StageSink): ...

    def capture_text(self, runtime: Any, inputs: ModelInputs, sink: StageSink, tower: dict): ...

    def replay_call(self, model: EmittedModel, stage_id: str, inputs: list, ctx: Any, contract: Contract): ...
