"""Every parameter error found before any model loads: runtimes, their policies and options, hypothesis patches,
the contract.

``driftscope run`` checks this before it starts anything, and the investigation's first step
(``parameters``) checks it again, so a bad third runtime never costs the first two their captures.
"""

from __future__ import annotations

from driftscope.capture.runtimes import get_runtime
from driftscope.errors import ParameterError
from driftscope.judge.contract import Contract, load_contract
from driftscope.run.params import Parameters


def check_parameters(params: Parameters) -> Contract:
    """Raise the first parameter error (unknown runtime, policy or runtime option, unimportable patch, bad contract);
    return the contract."""
    contract = load_contract(params.contract)
    for position, spec in enumerate(params.runtimes):
        runtime = get_runtime(spec.runtime)
        runtime.check_installed()  # a missing extra: "install driftscope[iree]"
        runtime.check_policy(spec.policy)
        runtime.check_options(spec.options, f"runtimes[{position}].options")
        if spec.patch is not None:
            spec.patch.resolve()
    _check_stage_selection(params)
    return contract


def _check_stage_selection(params: Parameters) -> None:
    """The stage selection and each mixed policy's float32 operators against the checkpoint's tower, when its config
    can be read now (else the checkpoint step says what is wrong with it): a block index it does not have, or an
    operator the runtime cannot keep in float32, is a parameter error."""
    import json

    from driftscope.families import detect_family, get_family

    try:
        config = json.loads((params.checkpoint / "config.json").read_text())
        family = get_family(detect_family(config, params.family))
        plan = family.vision_plan(config)
    except Exception:  # noqa: BLE001 - an unreadable or unknown checkpoint is the checkpoint step's to report
        return
    params.stages.check_depth(plan.depth)
    for position, spec in enumerate(params.runtimes):  # a mixed policy's float32 operators, each one it can widen
        if spec.options.get("f32"):
            try:
                get_runtime(spec.runtime).check_float32(spec.options["f32"], family, plan)
            except ParameterError as err:
                raise ParameterError(f"runtimes[{position}] ({spec.display}): {err.problem}", err.fix) from None
