"""Lower the JAX vision tower of one bucket shape, policy and tap selection to StableHLO text."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..emitters.qwen2_5_vl import VisionSpec, vision_tower
from ..emitters.qwen2_5_vl.layers import Contract
from ..precision import PrecisionPolicy

#: Graph input names after the weights, in call order.
INPUT_NAMES = ("pixel_values", "patch_gather", "positions", "window_segments", "image_segments", "merged_restore")


def contract_for(policy: PrecisionPolicy) -> Contract:
    return Contract(dot_inputs=policy.dot_inputs or "float32", state=policy.state or "float32")


def policy_digest(policy: PrecisionPolicy) -> str:
    return hashlib.sha256(json.dumps(policy.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


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

    @property
    def output_bytes(self) -> int:
        """Bytes of all outputs together: what one call of the graph holds at once."""
        import jax

        return sum(
            int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(self.lowered.out_info)
        )

    def arguments(self, weights: dict, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Flat argument list in the order the compiled function takes them (weights first, by name)."""
        return [weights[name] for name in sorted(weights)] + [inputs[name] for name in INPUT_NAMES]


def _header(policy: PrecisionPolicy, spec: VisionSpec, rows: int, taps: tuple[str, ...]) -> str:
    lines = [
        "// driftscope: Qwen2.5-VL vision tower (driftscope.emitters.qwen2_5_vl)",
        f"// precision policy: {policy.name}: {policy.description}",
        f"// policy contract: dot_inputs={policy.dot_inputs or 'float32'} state={policy.state or 'float32'} "
        "accumulate=float32 norm=float32 softmax=float32 rope=float32 outputs=float32",
        f"// bucket rows: {rows}; depth {spec.depth}; full attention blocks {list(spec.fullatt_block_indexes)}",
        f"// taps: {len(taps)} stages",
    ]
    return "\n".join(lines) + "\n"


def lower_vision_tower(
    spec: VisionSpec, policy: PrecisionPolicy, weights: dict, rows: int, taps: tuple[str, ...]
) -> LoweredGraph:
    """Lower for a bucket of ``rows`` patch rows; weights are arguments, never constants."""
    import jax
    import jax.numpy as jnp

    contract = contract_for(policy)
    taps = tuple(sorted(set(taps)))
    body = functools.partial(vision_tower, spec=spec, contract=contract, taps=taps)

    def call(weights, pixel_values, patch_gather, positions, window_segments, image_segments, merged_restore):
        return body(weights, pixel_values, patch_gather, positions, window_segments, image_segments, merged_restore)

    call.__name__ = "vision_tower_" + re.sub(r"\W", "_", policy.name)
    shape = jax.ShapeDtypeStruct
    weight_specs = {name: shape(array.shape, jnp.float32) for name, array in weights.items()}
    lowered = jax.jit(call, keep_unused=True).lower(
        weight_specs,
        shape((rows, spec.patch_dim), jnp.float32),
        shape((rows,), jnp.int32),
        shape((rows, 2), jnp.int32),
        shape((rows,), jnp.int32),
        shape((rows,), jnp.int32),
        shape((rows // spec.merge_unit,), jnp.int32),
    )
    text = _header(policy, spec, rows, taps) + lowered.as_text()
    names = jax.tree_util.tree_structure(lowered.out_info)
    output_names = sorted(lowered.out_info)  # dict outputs flatten in sorted key order
    assert names.num_leaves == len(output_names)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return LoweredGraph(text, digest, output_names, policy, rows, taps, lowered)


def lower_function(jitted, args: tuple, policy: PrecisionPolicy) -> LoweredGraph:
    """Lower any jitted function of ``args`` (a pytree of arrays); dict outputs are named by their keys."""
    lowered = jitted.lower(*args)
    header = f"// driftscope graph {jitted.__name__}; precision policy: {policy.name}: {policy.description}\n"
    text = header + lowered.as_text()
    names = sorted(lowered.out_info) if isinstance(lowered.out_info, dict) else ["output"]
    return LoweredGraph(text, hashlib.sha256(text.encode()).hexdigest(), names, policy, 0, (), lowered)
