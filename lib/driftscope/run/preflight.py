"""Every parameter error found before any model loads: runtimes, policies, hypothesis patches, the contract.

``driftscope run`` checks this before it starts anything, and the investigation's first step
(``parameters``) checks it again, so a bad third runtime never costs the first two their captures.
"""

from __future__ import annotations

from driftscope.capture.runtimes import get_runtime
from driftscope.judge.contract import Contract, load_contract
from driftscope.run.params import Parameters


def check_parameters(params: Parameters) -> Contract:
    """Raise the first parameter error (unknown runtime or policy, unimportable patch, bad contract);
    return the contract."""
    contract = load_contract(params.contract)
    for spec in params.runtimes:
        get_runtime(spec.runtime).check_policy(spec.policy)
        if spec.patch is not None:
            spec.patch.resolve()
    return contract
