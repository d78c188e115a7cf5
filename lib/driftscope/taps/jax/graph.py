"""Lower a family's JAX graph (one bucket shape, policy and tap selection) to StableHLO text."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from driftscope.model.precision import PrecisionPolicy
from driftscope.taps.jax.contract import Contract


def contract_for(policy: PrecisionPolicy) -> Contract:
    return Contract(
        dot_inputs=policy.dot_inputs or "float32", state=policy.state or "float32", f32=frozenset(policy.f32)
    )


def policy_digest(policy: PrecisionPolicy) -> str:
    return hashlib.sha256(json.dumps(policy.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _tree_bytes(tree) -> int:
    """Bytes of every array described in a JAX pytree of shapes and dtypes."""
    import jax

    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree_util.tree_leaves(tree))


@dataclass
class LoweredGraph:
    """StableHLO text (with a header naming the policy), its digest, and how to call it."""

    text: str
    digest: str
    output_names: list[str]
    policy: PrecisionPolicy
    rows: int
    taps: tuple[str, ...]
    lowered: Any  # jax.stages.Lowered, for the jax runtime
    input_names: tuple[str, ...] = ()  # graph inputs after the weights, in call order

    @property
    def output_bytes(self) -> int:
        """Bytes of all outputs together: what one call of the graph holds at once."""
        return _tree_bytes(self.lowered.out_info)

    @property
    def argument_bytes(self) -> int:
        """Bytes of all arguments of one call (weights and inputs): how large the compiled module's work is."""
        return 0 if self.lowered is None else _tree_bytes(self.lowered.args_info)

    def arguments(self, weights: dict, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Flat argument list in the order the compiled function takes them (weights first, by name)."""
        return [weights[name] for name in sorted(weights)] + [inputs[name] for name in self.input_names]


def lower_graph(
    function,
    name: str,
    weights: dict,
    inputs: dict[str, tuple[tuple[int, ...], str]],
    header: list[str],
    policy: PrecisionPolicy,
    rows: int,
    taps: tuple[str, ...],
) -> LoweredGraph:
    """Lower ``function(weights, *inputs)`` with weights as arguments in their dtype (never constants) and each
    input as ``(shape, dtype)``, in order; the text starts with ``header`` and the policy's contract."""
    import jax
    import jax.numpy as jnp

    def call(weights, *arguments):
        return function(weights, *arguments)

    call.__name__ = name + "_" + re.sub(r"\W", "_", policy.name)
    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD  # named arguments in the StableHLO's arg_info
    call.__signature__ = inspect.Signature([inspect.Parameter(n, parameter) for n in ("weights", *inputs)])
    shape = jax.ShapeDtypeStruct
    weight_specs = {key: shape(array.shape, jnp.dtype(array.dtype)) for key, array in weights.items()}
    lowered = jax.jit(call, keep_unused=True).lower(
        weight_specs, *(shape(dims, jnp.dtype(dtype)) for dims, dtype in inputs.values())
    )
    lines = [
        header[0],
        f"// precision policy: {policy.name}: {policy.description}",
        f"// policy contract: dot_inputs={policy.dot_inputs or 'float32'} state={policy.state or 'float32'} "
        "accumulate=float32 norm=float32 softmax=float32 rope=float32 outputs=float32",
        *([f"// in float32: {' '.join(policy.f32)}"] if policy.f32 else []),
        *header[1:],
        f"// taps: {len(taps)} stages",
    ]
    text = "\n".join(lines) + "\n" + lowered.as_text()
    output_names = sorted(lowered.out_info)  # dict outputs flatten in sorted key order
    assert jax.tree_util.tree_structure(lowered.out_info).num_leaves == len(output_names)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return LoweredGraph(text, digest, output_names, policy, rows, taps, lowered, tuple(inputs))


def lower_function(jitted, args: tuple, policy: PrecisionPolicy) -> LoweredGraph:
    """Lower any jitted function of ``args`` (a pytree of arrays); dict outputs are named by their keys."""
    lowered = jitted.lower(*args)
    header = f"// driftscope graph {jitted.__name__}; precision policy: {policy.name}: {policy.description}\n"
    text = header + lowered.as_text()
    names = sorted(lowered.out_info) if isinstance(lowered.out_info, dict) else ["output"]
    return LoweredGraph(text, hashlib.sha256(text.encode()).hexdigest(), names, policy, 0, (), lowered)
