"""The precision contract of the JAX operators, importable without JAX (JAX is imported when one is applied).

``Contract`` says which dtype feeds every dot/convolution (results are always float32) and which dtype the
residual stream and norm results are rounded through. ``driftscope.taps.jax.layers`` re-exports it next to
the operators that honour it; the compiled runtimes name it without importing JAX until they lower a graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax


@dataclass(frozen=True)
class Contract:
    dot_inputs: str = "float32"
    state: str = "float32"
    #: stage ids whose operators run in float32 (operands and state): a mixed policy's exceptions
    f32: frozenset[str] = frozenset()

    def at(self, stage_id: str) -> Contract:
        """The contract of the operator computing ``stage_id``: all float32 when the policy keeps it there."""
        if stage_id in self.f32:
            return Contract()
        return self

    def dot(self, x: jax.Array, w: jax.Array, contracting: tuple, batch: tuple = ((), ())) -> jax.Array:
        """``dot_general`` with operands in ``dot_inputs`` and a float32 result (F32 accumulation)."""
        import jax
        import jax.numpy as jnp

        dtype = jnp.dtype(self.dot_inputs)
        return jax.lax.dot_general(
            x.astype(dtype), w.astype(dtype), (contracting, batch), preferred_element_type=jnp.float32
        )

    def round_state(self, x: jax.Array) -> jax.Array:
        """Round through the state dtype (a no-op under float32)."""
        import jax.numpy as jnp

        if jnp.dtype(self.state) == jnp.float32:
            return x
        return x.astype(self.state).astype(jnp.float32)
