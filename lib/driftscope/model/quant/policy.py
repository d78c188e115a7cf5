"""The quantized precision policies (``q4``, ``q8``, fused or dequantized) and their options.

A policy name says the bits, how the quantized weights are executed and the activation dtype:
``q4`` (MLX's fused quantized matmul, float32 activations), ``q4-f16``, ``q4-bf16``, and
``q4-dequant`` (the same quantized weights dequantized on the host into dense weights of the
activation dtype), ``q4-dequant-f16``, ``q4-dequant-bf16``; the same for ``q8``. The runtime's
``options`` choose ``group_size`` (64), ``mode`` (affine), ``scope`` (vision, text or all) and may
restate ``bits``. :func:`quant_spec` validates them into one hashable :class:`QuantSpec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from driftscope.core.registry import Registry
from driftscope.errors import ParameterError
from driftscope.model.precision import PrecisionPolicy

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
MODES = ("affine",)
SCOPES = ("vision", "text", "all")
EXECUTIONS = ("fused", "dequant")
#: policy-name suffix -> activation dtype
ACTIVATIONS = {"": "float32", "-f16": "float16", "-bf16": "bfloat16"}
DEFAULT_GROUP_SIZE = 64
OPTION_KEYS = ("group_size", "bits", "mode", "scope")

#: Which runtime runs which quantized policies: MLX runs both executions, the oracle and the compiled
#: path run the host-dequantized weights in float32.
RUNTIME_POLICIES = {
    "mlx": tuple(f"q{b}{e}{a}" for b in BITS for e in ("", "-dequant") for a in ACTIVATIONS),
    "transformers": tuple(f"q{b}-dequant" for b in BITS),
    "jax": tuple(f"q{b}-dequant" for b in BITS),
    "iree": tuple(f"q{b}-dequant" for b in BITS),
}


@dataclass(frozen=True)
class QuantizedPolicy(PrecisionPolicy):
    """A :class:`PrecisionPolicy` whose matrix weights are affine-quantized to ``bits``."""

    bits: int = 4
    execution: str = "fused"  # fused | dequant

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "quantization": {"bits": self.bits, "execution": self.execution}}


@dataclass(frozen=True)
class QuantSpec:
    """Everything that decides the quantized weights and how they run; part of reports and cache keys."""

    bits: int
    group_size: int = DEFAULT_GROUP_SIZE
    mode: str = "affine"
    scope: str = "all"
    execution: str = "fused"
    activations: str = "float32"

    def __post_init__(self) -> None:
        for key, allowed in (
            ("bits", BITS),
            ("group_size", GROUP_SIZES),
            ("mode", MODES),
            ("scope", SCOPES),
            ("execution", EXECUTIONS),
            ("activations", tuple(ACTIVATIONS.values())),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or value not in allowed:
                raise ParameterError(
                    f"quantization {key}={value!r} is not supported", f"use one of: {', '.join(map(str, allowed))}"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def weights_key(self) -> tuple[int, int, str, str]:
        """What the quantized weights depend on (not how they run): fused and dequant share them."""
        return (self.bits, self.group_size, self.mode, self.scope)


def _policy(bits: int, execution: str, suffix: str) -> QuantizedPolicy:
    activations = ACTIVATIONS[suffix]
    dequant = execution == "dequant"
    name = f"q{bits}{'-dequant' if dequant else ''}{suffix}"
    half = activations != "float32"
    if dequant:
        how = f"dequantized on the host to dense {activations} weights, then ordinary matmuls"
    else:
        how = "MLX's fused quantized matmul" + (f" (the CPU kernel accumulates in {activations})" if half else "")
    return QuantizedPolicy(
        name,
        weights=f"q{bits}" if not dequant else activations,
        activations=activations,
        accumulate=activations if half and not dequant else "float32",
        norm=activations,
        softmax=activations,
        description=f"matrix weights affine-quantized to {bits} bits (group size from options, default "
        f"{DEFAULT_GROUP_SIZE}), {how}; activations in {activations}",
        bits=bits,
        execution=execution,
    )


QUANTIZED_POLICIES: tuple[QuantizedPolicy, ...] = tuple(
    _policy(bits, execution, suffix) for bits in BITS for execution in EXECUTIONS for suffix in ACTIVATIONS
)


def register_quantized_policies(registry: Registry[PrecisionPolicy]) -> None:
    """Add every quantized policy to a policy registry (``driftscope.model.policies.POLICIES``)."""
    for policy in QUANTIZED_POLICIES:
        registry.register(policy.name, policy)


def _option(options: Mapping[str, Any], key: str, default: Any, allowed: tuple, where: str) -> Any:
    value = options.get(key, default)
    if isinstance(value, bool) or value not in allowed:
        raise ParameterError(
            f"{where}.{key}={value!r} is not a supported quantization setting",
            f"use one of: {', '.join(str(a) for a in allowed)}",
        )
    return value


def quant_spec(policy: PrecisionPolicy, options: Mapping[str, Any] | None = None, where: str = "options") -> QuantSpec:
    """The validated :class:`QuantSpec` of a quantized ``policy`` under a runtime's ``options``."""
    if not isinstance(policy, QuantizedPolicy):
        raise ParameterError(
            f"policy {policy.name!r} is not quantized, so quantization options do not apply",
            f"use a quantized policy ({', '.join(p.name for p in QUANTIZED_POLICIES[:4])}, ...) "
            "or drop group_size/bits/mode/scope from the options",
        )
    options = dict(options or {})
    bits = options.get("bits", policy.bits)
    if bits != policy.bits:
        other = f"q{bits}{policy.name[2:]}" if bits in BITS else None
        raise ParameterError(
            f"{where}.bits={bits!r} contradicts policy {policy.name!r} ({policy.bits} bits)",
            f"use policy {other!r}" if other else f"drop {where}.bits (supported: {', '.join(map(str, BITS))})",
        )
    return QuantSpec(
        bits=policy.bits,
        group_size=_option(options, "group_size", DEFAULT_GROUP_SIZE, GROUP_SIZES, where),
        mode=_option(options, "mode", "affine", MODES, where),
        scope=_option(options, "scope", "all", SCOPES, where),
        execution=policy.execution,
        activations=policy.activations,
    )
