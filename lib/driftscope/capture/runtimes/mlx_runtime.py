"""Eager MLX through mlx-vlm's model code, captured by wrappers that do not change results.

The checkpoint's family loads mlx-vlm's model (adapting the config where mlx-vlm needs it) and says
where to record (its ``mlx_taps`` module, :class:`MLXTaps`). Wrappers call the original module or
function and record what it returned, so every tap is the value the model actually computed.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from driftscope.capture.runtimes.base import Runtime, package_versions, require
from driftscope.errors import PortLimitError, RuntimeUnavailableError
from driftscope.families.capabilities import MLXCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.quant.policy import RUNTIME_POLICIES
from driftscope.taps.mlx_hooks import RMSNORM_FORMS, dtype_name, use_manual_rmsnorm
from driftscope.taps.sink import StageSink
from driftscope.taps.stages import StagePlan
from driftscope.taps.substitute import substitution_target
from driftscope.taps.tapset import TapSet


@runtime_checkable
class MLXTaps(Protocol):
    """What a family tells this engine (module-level names of ``families/<family>/mlx_taps.py``)."""

    CAPABILITIES: MLXCapabilities  # what else it declares (what the family's mlx-vlm port cannot represent)

    def load(self, path: Path, config: dict) -> Any: ...

    def rms_norms(self, model: Any) -> list[tuple[Any, str]]: ...

    def run_vision(self, model: Any, inputs: ModelInputs) -> Any: ...

    # may return the tower's output, which is then handed to capture_text as ``tower=`` (no second tower run)
    def capture(self, model: Any, inputs: ModelInputs, sink: StageSink) -> Any: ...

    def capture_text(self, model: Any, inputs: ModelInputs, sink: StageSink, **tower: Any) -> None: ...

    def replay(self, model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray: ...


class MLXRuntime(Runtime):
    """mlx-vlm's eager model on MLX (CPU here; Metal on a Mac)."""

    name = "mlx"
    ENGINE_MODULE = MLXTaps
    CAPABILITIES = MLXCapabilities
    REQUIRES = {"mlx.core": "mlx", "mlx_vlm": "mlx-vlm"}  # driftscope's dependencies on macOS and Linux
    policies = ("f32", "f16", "bf16", *RUNTIME_POLICIES["mlx"])
    OPTIONS = {
        "rmsnorm": "fused (mlx.nn.RMSNorm, default) or manual (written out in the activation dtype)",
        "f32": "stages whose operators compute in float32 under a half-precision policy (model.mixed; e.g. "
        "[vision.block.17-31.norm2]), after the hypothesis patch",
    }
    OPTION_VALUES = {"rmsnorm": RMSNORM_FORMS}
    OPTION_TYPES = {"f32": "list of texts"}

    def __init__(self, checkpoint, policy: str = "f32", patch=None, options: dict | None = None):
        super().__init__(checkpoint, policy, patch, options)
        if self.options.get("f32"):  # a mixed policy: those operators in float32 (model.mixed)
            self.policy = self.mixed_policy()

    def load(self) -> None:
        fresh = self.model is None
        super().load()
        if fresh and self.policy.f32:
            self.keep_float32(list(self.policy.f32))

    def keep_float32(self, stage_ids: list[str]):
        """Compute the operators of ``stage_ids`` in float32 (in place); returns what undoes it."""
        from driftscope.taps.mlx_hooks import keep_float32

        return keep_float32(self.family.precision_module().mlx_sites(self.model, stage_ids))

    def _load(self) -> Any:
        from driftscope.model.blas import mlx_blas

        mlx_blas()  # before the first `import mlx.core`
        mx = require("mlx.core", "mlx", self.name, self.EXTRA)
        require("mlx_vlm", "mlx-vlm", self.name, self.EXTRA)
        self.refuse_unrepresentable()
        model = self.taps.load(self.checkpoint.path, self.checkpoint.config)
        if self.quantized is not None and self.quantized.quantize_on_load:  # a fused policy on a dense checkpoint
            from driftscope.model.quant.mlx_checkpoint import quantize_loaded

            model.set_dtype(mx.float32)  # quantized from float32, as the host quantizes the checkpoint's tensors
            quantize_loaded(model, self.family.quant_profile().mlx, self.quantized.spec)
        # every policy casts, f32 too: a bf16 checkpoint would otherwise run in bf16 under "f32" (quantized
        # layers: their scales and biases, which the fused kernel then computes in)
        model.set_dtype(getattr(mx, self.policy.activations))
        mx.eval(model.parameters())
        if self.options.get("rmsnorm", "fused") == "manual":  # a known form: ``check_options`` saw to it
            use_manual_rmsnorm(self.taps.rms_norms(model))
        return model

    def loaded_tensors(self) -> dict:
        import mlx.core as mx
        from mlx.utils import tree_flatten

        def rows_of(array):
            return lambda rows: np.array((array if rows is None else array[mx.array(rows)]).astype(mx.float32))

        return {
            name: (tuple(array.shape), dtype_name(array), rows_of(array))
            for name, array in tree_flatten(self.model.parameters())
        }

    def check_capture(self, inputs: ModelInputs, plan: StagePlan) -> None:
        """Refuse a text capture whose dense stacked experts MLX's CPU backend cannot multiply in this dtype."""
        if inputs.text is None or not any(stage.id.startswith("text.") for stage in plan):
            return
        from driftscope.taps.mlx_hooks import half_gather_experts

        experts = sorted(half_gather_experts(self.model))
        if experts:
            version = package_versions("mlx").get("mlx", "?")
            raise RuntimeUnavailableError(
                f"MLX {version}'s CPU backend computes mx.gather_mm (the mixture-of-experts layers' dense stacked "
                f"experts, {len(experts)} of them, e.g. {experts[0]}) in float32 only, and policy "
                f"{self.policy.name!r} runs them in {self.policy.activations}",
                "run mlx on this checkpoint with policy f32, or with a fused quantized policy whose experts are all "
                "quantized (q4-f16, q4-bf16: mx.gather_qmm runs half precision on the CPU), or on a Metal GPU; "
                "the run's other runtimes still run and are compared",
            )

    def refuse_unrepresentable(self) -> None:
        """Refuse, before loading, a config whose settings the family's mlx-vlm port cannot represent: the port is
        the limit there, not config.json."""
        unrepresentable = self.capabilities.unrepresentable
        limits = unrepresentable(self.checkpoint.config, self.checkpoint.path) if unrepresentable else []
        if limits:
            version = package_versions("mlx-vlm").get("mlx-vlm", "?")
            raise PortLimitError(
                f"mlx-vlm {version}'s {self.family.name} port cannot represent this config: {'; '.join(limits)}",
                "config.json is right and the MLX port is the limit: the run's other runtimes still run and are "
                "compared; leave mlx out for this checkpoint, or patch mlx-vlm's port",
            )

    def release(self) -> None:
        super().release()
        import mlx.core as mx

        from driftscope.core.memory import give_back

        mx.clear_cache()  # MLX keeps freed buffers for reuse; give them back
        give_back()

    def versions(self) -> dict[str, str]:
        from driftscope.model.blas import mlx_blas

        return {**package_versions("mlx", "mlx-vlm"), "blas": mlx_blas()}

    def weight_dtypes(self) -> dict[str, int]:
        from collections import Counter

        from mlx.utils import tree_flatten

        return dict(Counter(dtype_name(value) for _, value in tree_flatten(self.model.parameters())))

    def run_vision(self, inputs: ModelInputs):
        """The plain vision forward (no taps): the tower's output."""
        import mlx.core as mx

        self.load()
        out = self.taps.run_vision(self.model, inputs)
        mx.eval(out)
        return out

    def _capture(self, inputs: ModelInputs, sink: StageSink) -> None:
        self.put_inputs(inputs, sink)
        self._tower = self.taps.capture(self.model, inputs, sink)

    can_replay = True
    decodes = True

    def _capture_text(self, inputs: ModelInputs, sink: StageSink) -> None:
        """mlx-vlm's full model: merged embeddings and positions from its own code, prefill, greedy decode."""
        tower, self._tower = self.__dict__.pop("_tower", None), None  # the tower's output, when the family gave it
        with self.substituting(inputs):
            self.taps.capture_text(self.model, inputs, sink, **({"tower": tower} if tower is not None else {}))

    substitutes = True

    def substituting(self, inputs: ModelInputs):
        """The prefill reads ``inputs.text.image_embeds`` at the image slots, when set (the decoder's own
        embeddings argument, rewritten on its way in)."""
        text = inputs.text
        if text is None or text.image_embeds is None:
            return nullcontext()
        from driftscope.taps.substitute import mlx_image_rows

        substitution_target(self, getattr(self.model, "language_model", None), "model")
        return mlx_image_rows(self.model.language_model, "model", text)

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """mlx-vlm's own modules (in the policy's dtype) applied to ``inputs``."""
        self.load()
        return self.taps.replay(self.model, stage_id, inputs, ctx)

    def same_input_controls(self, reference: TapSet, plan: StagePlan) -> dict | None:
        """Under a fused quantized policy: each quantized linear run fused and dequantized on the reference's input."""
        if self.quantized is None or self.quantized.spec.execution != "fused":
            return None
        from driftscope.capture.linear_controls import replay_linears

        self.load()
        return replay_linears(self.model, self.family, reference, plan, self.policy.activations)
