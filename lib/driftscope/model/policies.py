"""Every precision policy by name, one registry: the float ones (``precision``) and the quantized ones
(``quant.policy``)."""

from __future__ import annotations

from driftscope.core.registry import Registry
from driftscope.model.precision import FLOAT_POLICIES, PrecisionPolicy
from driftscope.model.quant.policy import register_quantized_policies

POLICIES: Registry[PrecisionPolicy] = Registry("precision policy")
for _policy in FLOAT_POLICIES:
    POLICIES.register(_policy.name, _policy)
register_quantized_policies(POLICIES)


def get_policy(name: str) -> PrecisionPolicy:
    """The registered policy called ``name`` (an unknown name lists the valid ones)."""
    return POLICIES.get(name)
