"""One runtime's step of an investigation: its capture (the reference's through ``run.refcache``), its checks
and its entry in the report, then, for a candidate, its narrowing and replay; its model released after."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from driftscope.capture.runtime_checks import audit_checks, capture_checks, failed, observed_dtypes, unreadable
from driftscope.core.names import safe_name
from driftscope.errors import HypothesisPatchError, OutputError, ParameterError, TapFileError
from driftscope.replay.recapture import how
from driftscope.run.candidates import Pairs, judge_candidate
from driftscope.run.isolated import capture_isolated, isolated
from driftscope.run.refcache import capture_cached

if TYPE_CHECKING:
    from driftscope.capture.runtimes.base import Runtime
    from driftscope.inputs.processor_output import ModelInputs
    from driftscope.judge.contract import Contract
    from driftscope.run.params import Parameters, RuntimeSpec
    from driftscope.run.report import Report
    from driftscope.taps.stages import StagePlan
    from driftscope.taps.tapset import TapSet

#: errors of a candidate that stop the whole run (any other one makes only that candidate's pairs "could not run")
STOPS_THE_RUN = (OSError, OutputError, HypothesisPatchError, ParameterError)


def _capture(
    report: Report, out: Path, spec: RuntimeSpec, runtime: Runtime, inputs, plan, reference: bool, log, detail
):
    """(TapSet, weight dtypes, the reference cache's outcome or None). A candidate running a patch from outside
    driftscope is captured in a process of its own (``run.isolated``): a crash there costs that candidate."""
    base = out / "taps" / safe_name(spec.display)

    def progress(message: str, label: str = spec.display) -> None:
        log(f"  {label}: {message}")

    if not reference and isolated(spec):
        tapset, dtypes = capture_isolated(runtime.source, spec, inputs, plan, base, log, detail)
        return tapset, dtypes, None
    if not reference:
        tapset = runtime.capture(inputs, plan, base, progress=progress)
        return tapset, runtime.weight_dtypes(), None
    stored_by = {"commit": report.data.get("commit"), "out": str(out)}
    return capture_cached(runtime, inputs, plan, base, log, stored_by, progress)


def capture_one(
    params: Parameters,
    report: Report,
    out: Path,
    spec: RuntimeSpec,
    runtime: Runtime,
    inputs: ModelInputs,
    plan: StagePlan,
    contract: Contract,
    tapsets: dict[str, TapSet],
    compared: dict[tuple[str, str], list],
    pairs: Pairs,
    log: Callable[[str], None],
    detail: Callable[[str], None] = lambda text: None,
) -> None:
    """One runtime's capture (and narrowing and replay) into ``tapsets`` and the report; its model is released
    after. ``detail``: writes a traceback to the run's log file only."""
    report.step(f"capture:{spec.display}")
    log(f"capture {spec.display}: {len(plan)} stages")
    is_reference = spec.display == params.reference_label
    runtime.strict_audit = is_reference  # a reference that did not load its checkpoint stops the run
    try:
        tapset, dtypes, cached = _capture(report, out, spec, runtime, inputs, plan, is_reference, log, detail)
    except Exception as err:  # a candidate that cannot load or capture: its pairs could not run, the others still do
        if is_reference or isinstance(err, STOPS_THE_RUN):
            raise  # nothing to compare without the reference; a full disk or a user's failing patch stops the run
        unread = isinstance(err, TapFileError) and runtime.external
        checks = unreadable(str(err)) if unread else failed(err, loaded=runtime.model is not None)
        report.data["checks"][spec.display] = checks
        report.save()
        log(f"  {spec.display}: could not run: {checks[0]['detail']}")
        detail("".join(traceback.format_exception(err)))
        runtime.release()
        return
    tapsets[spec.display] = tapset
    external = runtime.external
    report.data["checks"][spec.display] = capture_checks(tapset, inputs.digest, spec.policy if external else None)
    report.data["checks"][spec.display] += audit_checks(tapset)
    report.data["runtimes"].append(
        {
            "label": spec.display,
            "runtime": spec.runtime,
            "policy": runtime.report_policy(tapset),
            **({"policy_label": spec.policy} if external else {}),
            "observed_dtypes": {"weights": dtypes, "activations": observed_dtypes(tapset)},
            "patch": tapset.meta.get("patch"),
            "versions": tapset.meta.get("versions"),
            "options": spec.options,
            "tapset": str(tapset.tensor_path.relative_to(out)),
            "timings": tapset.meta.get("timings", {}),
            "artifact": tapset.meta.get("artifact"),
            "quantization": tapset.meta.get("quantization"),
            "bucket": tapset.meta.get("bucket"),
            "stages": len(tapset.stage_ids()),
            **({"answer_evidence": tapset.meta["answer_evidence"]} if tapset.meta.get("answer_evidence") else {}),
            **({"reference_cache": cached} if cached is not None else {}),
        }
    )
    if cached is not None:
        report.data["reference_cache"] = {"label": spec.display, **cached}
    report.save()
    if cached is None or cached["status"] != "hit":
        seconds = runtime.timings.get("capture_s", (tapset.meta.get("timings") or {}).get("capture_s", 0.0))
        log(f"  {spec.display}: done in {seconds:.1f}s")
    narrows = params.narrow and how(runtime) is not None
    if not is_reference and (narrows or (params.replays(spec.display) and runtime.can_replay)):
        reference = tapsets[params.reference_label]
        compared[(reference.label, tapset.label)] = judge_candidate(
            report, out, runtime, inputs, plan, contract, tapsets, pairs, params.replays(spec.display), log
        )
    runtime.release()
