"""Precision policies: named, hashable descriptions of dtypes and where rounding happens (the float ones here;
every registered policy, the quantized ones included, through ``driftscope.model.policies``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrecisionPolicy:
    """Where a runtime keeps which dtype.

    ``weights`` and ``activations`` name the storage dtype; ``accumulate`` the dtype of dot
    products; ``norm`` and ``softmax`` where normalization happens. Compiled paths add the
    contract: ``dot_inputs`` (the operand dtype of every dot and convolution) and ``state``
    (the dtype the residual stream, norm results and block outputs are rounded through).
    Part of every report; frozen, so it hashes into compiled-artifact keys.
    """

    name: str
    weights: str
    activations: str
    accumulate: str = "float32"
    norm: str = "float32"
    softmax: str = "float32"
    description: str = ""
    dot_inputs: str = ""
    state: str = ""
    #: stage ids whose operators compute in float32 whatever the rest does (``model.mixed``: a precision search's
    #: answer); empty for every registered policy
    f32: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        extra = {"f32": list(self.f32)} if self.f32 else {}  # absent when empty: old digests stay as they were
        return {
            "name": self.name,
            "weights": self.weights,
            "activations": self.activations,
            "accumulate": self.accumulate,
            "norm": self.norm,
            "softmax": self.softmax,
            "description": self.description,
            "dot_inputs": self.dot_inputs or self.weights,
            "state": self.state or self.activations,
            **extra,
        }


#: The float policies; ``driftscope.model.policies`` registers them with the quantized ones.
FLOAT_POLICIES: tuple[PrecisionPolicy, ...] = (
    PrecisionPolicy("f32", "float32", "float32", description="everything in float32"),
    PrecisionPolicy("f64", "float64", "float64", "float64", "float64", "float64", "float64 oracle"),
    PrecisionPolicy(
        "tf32",
        "float32",
        "float32",
        description="float32, with every matmul and convolution operand rounded to TF32's 10-bit mantissa before a "
        "float32-accumulated product (allow_tf32 on an NVIDIA GPU, emulated on the CPU)",
        dot_inputs="tf32",
    ),
    PrecisionPolicy(
        "f16", "float16", "float16", "float16", "float16", "float16", "weights and activations in float16 (eager)"
    ),
    PrecisionPolicy(
        "bf16", "bfloat16", "bfloat16", "bfloat16", "bfloat16", "bfloat16", "weights and activations in bfloat16"
    ),
    # Compiled-path contracts (the jax and iree runtimes): weights stay float32 in the graph's arguments.
    PrecisionPolicy(
        "f16-contract",
        "float32",
        "float32",
        description="F16 operands for every dot/convolution, F32 accumulation and results; "
        "F32 normalization, softmax, RoPE and outputs",
        dot_inputs="float16",
        state="float32",
    ),
    PrecisionPolicy(
        "f16-state",
        "float32",
        "float32",
        description="f16-contract, and the residual stream, norm results and block outputs rounded through F16",
        dot_inputs="float16",
        state="float16",
    ),
)
