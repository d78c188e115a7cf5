"""Eager MLX through mlx-vlm's model code, captured by wrappers that do not change results.

The checkpoint's family loads mlx-vlm's model (adapting the config where mlx-vlm needs it) and says
where to record (its ``mlx_taps`` module, :class:`MLXTaps`). Wrappers call the original module or
function and record what it returned, so every tap is the value the model actually computed.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..inputs import ModelInputs
from ..quant.policy import RUNTIME_POLICIES
from ..stages import StagePlan
from ..tapset import TapSet
from .base import Runtime, StageSink, package_versions, require


def to_numpy(array: Any) -> np.ndarray:
    """An MLX array as numpy (bfloat16 and float16 widened to float32, which is exact)."""
    import mlx.core as mx

    if array.dtype in (mx.bfloat16, mx.float16):
        array = array.astype(mx.float32)
    return np.array(array)


def dtype_name(array: Any) -> str:
    """An MLX array's dtype as numpy names it (``mlx.core.bfloat16`` -> ``bfloat16``)."""
    return str(array.dtype).rsplit(".", 1)[-1]


class Recording:
    """Calls ``inner`` and hands its inputs and output to ``record``."""

    def __init__(self, inner: Any, record):
        self.inner = inner
        self.record = record

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        self.record(args, kwargs, out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def shadow(owner: Any, name: str, value: Any):
    """Make ``owner.name`` resolve to ``value`` (an instance attribute), then put back what was there.

    A precision experiment or hypothesis patch may itself have shadowed ``name`` (e.g. a manual
    RMSNorm): that instance attribute is restored, not dropped, so a later replay runs the same operator.
    """
    missing = object()
    previous = owner.__dict__.get(name, missing)
    object.__setattr__(owner, name, value)
    try:
        yield
    finally:
        if previous is missing:
            object.__delattr__(owner, name)
        else:
            object.__setattr__(owner, name, previous)


@contextmanager
def list_item(items: list, index: int, value: Any):
    original = items[index]
    items[index] = value
    try:
        yield
    finally:
        items[index] = original


@contextmanager
def module_attr(module: Any, name: str, value: Any):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class ManualRMSNorm:
    """RMSNorm written out in the activation dtype: squares in F16 overflow above |x| = 256.

    The fused ``mx.fast.rms_norm`` (mlx.nn.RMSNorm) accumulates in float32 and does not.
    """

    def __init__(self, norm: Any):
        self.weight = norm.weight
        self.eps = norm.eps

    def __call__(self, x):
        import mlx.core as mx

        variance = mx.mean(x * x, axis=-1, keepdims=True)  # in x's dtype, as a hand-written port does it
        return self.weight * (x * mx.rsqrt(variance + mx.array(self.eps, dtype=x.dtype)))


RMSNORM_FORMS = ("fused", "manual")


def use_manual_rmsnorm(sites: list[tuple[Any, str]]) -> None:
    """Swap the RMSNorm at each ``(owner, attribute)`` for :class:`ManualRMSNorm` (the precision experiment)."""
    for owner, name in sites:
        object.__setattr__(owner, name, ManualRMSNorm(getattr(owner, name)))


@runtime_checkable
class MLXTaps(Protocol):
    """What a family tells this engine (module-level names of ``families/<family>/mlx_taps.py``)."""

    def load(self, path: Path, config: dict) -> Any: ...

    def rms_norms(self, model: Any) -> list[tuple[Any, str]]: ...

    def run_vision(self, model: Any, inputs: ModelInputs) -> Any: ...

    def capture(self, model: Any, inputs: ModelInputs, sink: StageSink) -> None: ...

    def capture_text(self, model: Any, inputs: ModelInputs, sink: StageSink) -> None: ...

    def replay(self, model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray: ...


class MLXRuntime(Runtime):
    """mlx-vlm's eager model on MLX (CPU here; Metal on a Mac)."""

    name = "mlx"
    policies = ("f32", "f16", "bf16", *RUNTIME_POLICIES["mlx"])

    def _load(self) -> Any:
        from ..blas import mlx_blas

        mlx_blas()  # before the first `import mlx.core`
        mx = require("mlx.core", "mlx", self.name)
        require("mlx_vlm", "mlx-vlm", self.name)
        model = self.taps.load(self.checkpoint.path, self.checkpoint.config)
        if self.quantized is not None and self.quantized.quantize_on_load:  # a fused policy on a dense checkpoint
            from ..quant.mlx_checkpoint import quantize_loaded

            model.set_dtype(mx.float32)  # quantized from float32, as the host quantizes the checkpoint's tensors
            quantize_loaded(model, self.family.quant_profile().mlx, self.quantized.spec)
        # every policy casts, f32 too: a bf16 checkpoint would otherwise run in bf16 under "f32" (quantized
        # layers: their scales and biases, which the fused kernel then computes in)
        model.set_dtype(getattr(mx, self.policy.activations))
        mx.eval(model.parameters())
        form = self.options.get("rmsnorm", "fused")
        if form not in RMSNORM_FORMS:
            from ..errors import ParameterError

            raise ParameterError(f"mlx option rmsnorm={form!r} is not known", f"use one of: {', '.join(RMSNORM_FORMS)}")
        if form == "manual":
            use_manual_rmsnorm(self.taps.rms_norms(model))
        return model

    def release(self) -> None:
        super().release()
        import mlx.core as mx

        mx.clear_cache()  # MLX keeps freed buffers for reuse; give them back

    def versions(self) -> dict[str, str]:
        from ..blas import mlx_blas

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
        self.taps.capture(self.model, inputs, sink)

    can_replay = True
    decodes = True

    def _capture_text(self, inputs: ModelInputs, sink: StageSink) -> None:
        """mlx-vlm's full model: merged embeddings and positions from its own code, prefill, greedy decode."""
        self.taps.capture_text(self.model, inputs, sink)

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """mlx-vlm's own modules (in the policy's dtype) applied to ``inputs``."""
        self.load()
        return self.taps.replay(self.model, stage_id, inputs, ctx)

    def same_input_controls(self, reference: TapSet, plan: StagePlan) -> dict | None:
        """Under a fused quantized policy: each quantized linear run fused and dequantized on the reference's input."""
        if self.quantized is None or self.quantized.spec.execution != "fused":
            return None
        from ..quant.linear_controls import replay_linears

        self.load()
        return replay_linears(self.model, self.family, reference, plan, self.policy.activations)
