"""Orchestration: parameters -> inputs -> each runtime's capture -> compare -> report.json.

The report is written after every step, so a crash leaves a report that says where it stopped.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from driftscope.capture.runtime_checks import apply_checks
from driftscope.capture.runtimes import get_runtime
from driftscope.core.names import new_run_id, remove_partial_files, safe_name, writing_for
from driftscope.core.paths import project_root
from driftscope.errors import (
    DriftscopeError,
    ReportError,
)
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.verdict import judge
from driftscope.judge.yardstick import apply_yardsticks, yardsticks
from driftscope.model.checkpoint_storage import checkpoint_storage
from driftscope.replay.narrowing import ReferenceCache
from driftscope.run.candidates import Pairs, teacher_force
from driftscope.run.capture_step import capture_one
from driftscope.run.environment import current_commit, fingerprint
from driftscope.run.inputcache import cached_inputs
from driftscope.run.outdirs import interactive_out_dir
from driftscope.run.params import Parameters, load_parameters
from driftscope.run.preflight import check_parameters
from driftscope.run.report import Report
from driftscope.run.reuse import reads, stale_reason
from driftscope.run.runlock import (
    RunLock,
    held_by_parent,
    refuse_orphaned_notebook,
    run_lock,
    run_pid,
    wait_for_result,
)
from driftscope.run.substitution import explain_answer
from driftscope.taps.stages import StagePlan

if TYPE_CHECKING:
    pass

LOG_NAME = "investigation.log"
_log_files: list[TextIO] = []  # the running investigation's log file, which a waiting notebook prints


class InvestigationFailed(DriftscopeError):
    """The run this process waited for (another process, same parameters) stopped with an error."""


def log(message: str) -> None:
    line = f"[driftscope {time.strftime('%H:%M:%S')}] {message}"
    print(line, file=sys.stdout, flush=True)
    for handle in _log_files:
        handle.write(line + "\n")
        handle.flush()


def default_out_dir(params: Parameters, root: Path | None = None) -> Path:
    """``outputs/<commit>/<name>/`` under ``root``, default :func:`~driftscope.core.paths.project_root` of the
    parameter file (its git repository, else the current folder); the name made safe as a directory name."""
    root = project_root(params.source) if root is None else root
    return root / "outputs" / current_commit(root) / safe_name(params.name)


def investigate(
    params: Parameters | str | Path, out_dir: str | Path | None = None, reuse: bool = False, lock: RunLock | None = None
) -> Report:
    """Run the investigation; with ``reuse``, return a finished report of the same parameters instead.

    One investigation writes into a directory at a time. With ``reuse``, a run of the same directory in
    progress in another process is waited for and its report returned; if it failed, its error is raised
    rather than running it again (so too in a notebook started by ``driftscope run``, which runs the
    investigation itself and holds the directory until its notebooks are rendered). A run that was killed
    (its report says ``running`` but its process is gone) is run again. Without ``reuse``, a run in
    progress is an error. ``lock``: the directory's lock, already held by the caller. Without ``out_dir``, see
    :func:`interactive_out_dir`.
    """
    if not isinstance(params, Parameters):
        params = load_parameters(params)
    out = Path(out_dir) if out_dir else interactive_out_dir(params, default_out_dir(params), log)
    if lock is None and reuse and held_by_parent(out):
        wait_for_result(out)  # this is a notebook of the `driftscope run` that holds the directory
        return _finished(params, out, waited=True, parent=True)
    if lock is None:
        refuse_orphaned_notebook(out)
    with nullcontext(lock) if lock else run_lock(out, wait=reuse, log=log) as held:
        report_path = out / "report.json"
        if reuse:
            previous = _finished(params, out, held.waited)
            if previous is not None:
                return previous
        with open(out / LOG_NAME, "w", encoding="utf-8") as log_file:
            _log_files.append(log_file)
            try:
                return _investigate(params, out, report_path)
            finally:
                _log_files.remove(log_file)


def _finished(params: Parameters, out: Path, waited: bool, parent: bool = False) -> Report | None:
    """The finished report of these parameters in ``out``, or None to run them (again).

    A failed report of the run this process ``waited`` for (or its ``parent`` ran) raises its error instead."""
    report_path = out / "report.json"
    try:
        previous = Report.load(report_path) if report_path.exists() or parent else None
    except ReportError as err:
        if parent:
            raise InvestigationFailed(
                f"the run that started this notebook left no usable report: {err.problem}",
                f"see {out / LOG_NAME} and the run's own output",
            ) from None
        log(f"ignoring the unreadable report in {out}: {err.problem}")
        return None
    if previous is None or previous.data.get("parameters_digest") != params.digest:
        if parent:
            raise InvestigationFailed(
                f"the run that started this notebook (pid {run_pid()}) wrote no report of these parameters",
                f"see {out / LOG_NAME} and the run's own output",
            )
        return None
    status = previous.status
    stale = None if parent or status != "complete" else stale_reason(previous.data, params)
    if stale:
        log(f"not reusing the finished run in {out}: {stale}; running it again")
        return None
    if status == "complete":
        if waited and (out / LOG_NAME).exists():  # show the progress of the run waited for
            print((out / LOG_NAME).read_text(), end="", flush=True)
        log(f"reusing the finished run in {out}")
        return previous
    if waited:
        error = previous.data.get("error") or {}
        problem, _, fix = str(error.get("message", "")).partition("\n  fix: ")  # its own fix, said once
        cause = f"{error['type']}: {problem}" if error else f"no error recorded ({previous.stopped()})"
        where, stopped = f"{report_path} and {out / LOG_NAME}", previous.data.get("stopped_at")
        fixed = f"{fix} (details: {where})" if fix else f"see {where}; fix the cause and run again"
        raise InvestigationFailed(f"the investigation this run waited for stopped at {stopped}: {cause}", fixed)
    if status == "dead":
        log(f"the run in {out} died: {previous.stopped()}; running it again")
    return None


def _previous_run_id(report_path: Path) -> str | None:
    """The run id of the run that last wrote ``report_path`` (whose partial files a kill may have left), if any."""
    import json

    try:
        data = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("run_id") if isinstance(data, dict) and isinstance(data.get("run_id"), str) else None


def _investigate(params: Parameters, out: Path, report_path: Path) -> Report:
    previous = _previous_run_id(report_path)
    run_id = new_run_id()
    with writing_for(run_id):  # every partial file this run writes carries its id
        return _investigate_as(params, out, report_path, previous, run_id)


def _investigate_as(params: Parameters, out: Path, report_path: Path, previous: str | None, run_id: str) -> Report:
    report = Report.start(
        report_path,
        run_id=run_id,
        name=params.name,
        description=params.description,
        commit=current_commit(project_root(params.source)),
        parameters=params.to_dict(),
        parameters_file=params.source,
        parameters_digest=params.digest,
        pid=os.getpid(),
        host=socket.gethostname(),
        environment=fingerprint(),
    )
    removed = remove_partial_files(out, previous)  # the last run's own, named by its id: never a pattern
    if removed:
        log(f"removed {len(removed)} partial file(s) the last run left (e.g. {removed[0].name})")
    try:
        _run(params, report, out)
    except BaseException as err:
        report.fail(err)
        log(f"stopped at {report.data['stopped_at']}: {type(err).__name__}: {err}")
        _log_detail("".join(traceback.format_exception(err)))
        raise
    return report


def _log_detail(text: str) -> None:
    """Write ``text`` (e.g. a traceback) to the run's log file only."""
    for handle in _log_files:
        handle.write(text)
        handle.flush()


def _power(params: Parameters, report: Report, out: Path, checkpoint, inputs, reference, contract, plan) -> None:
    """Run the mutation audit and gate the verdict on the mutations the parameters require."""
    from driftscope.replay.power import fixture_power, power_gate
    from driftscope.run.refcache import mutation_capture

    report.step("power")
    names = params.power["mutations"]
    if names == "all":
        names = get_family(checkpoint.family).mutation_registry().names()
        names += [name for name in params.power["require"] if name not in names]
    log(f"fixture power: {len(names)} mutations against {reference.label}")
    cached: list[dict] = []
    power = fixture_power(
        reference,
        checkpoint,
        inputs,
        plan,
        contract,
        out / "taps" / "mutations",
        names,
        params.power["policy"],
        log,
        mutation_capture(log, {"commit": report.data.get("commit"), "out": str(out)}, cached),
    )
    if cached:
        power["reference_cache"] = {"hit": sum(c["status"] == "hit" for c in cached), "captures": cached}
    for entry in power["mutations"]:
        entry["tapset"] = str(Path(entry["tapset"]).relative_to(out))
    power["require"] = params.power["require"]
    reasons = power_gate(power, params.power["require"])
    power["gate"] = "fail" if reasons else "pass"
    report.data["power"] = power
    if reasons:
        verdict = report.data["verdict"]
        verdict["status"] = "fail"
        verdict["reasons"] = list(verdict.get("reasons", [])) + reasons
        verdict["per_candidate"]["fixture power"] = "fail"
    report.save()


def _run(params: Parameters, report: Report, out: Path) -> None:
    report.step("parameters")
    contract = check_parameters(params)  # every parameter error before any model loads
    report.data["reads"] = reads(params)  # what the run reads, by content: a later reuse checks it
    report.step("checkpoint")
    checkpoint = open_checkpoint(params.checkpoint, params.family)
    family = get_family(checkpoint.family)
    full = family.plan_for(checkpoint)
    plan = full.select(params.stages)
    if params.text:
        text = family.text_stages_for(checkpoint, params.text["max_new_tokens"])
        full = StagePlan(full.family, full.stages + text, full.depth, dict(full.meta))
        chosen = [stage for stage in text if params.stages.wants(stage, full.depth)]
        plan = StagePlan(plan.family, plan.stages + chosen, plan.depth, dict(plan.meta))
    report.data.update(
        family=checkpoint.family,
        checkpoint=str(checkpoint.path),
        checkpoint_storage=checkpoint_storage(checkpoint.path),
        contract=contract.to_dict(),
        reference=params.reference_label,
        stage_plan=[stage.to_dict() for stage in plan],
        plan_meta={"depth": plan.depth, **plan.meta},
        runtimes=[],
        checks={},
    )
    runtimes = []
    for spec in params.runtimes:  # resolve every runtime before the slow work starts
        runtimes.append(
            (
                spec,
                get_runtime(spec.runtime)(checkpoint, spec.policy, spec.patch, {**spec.options, "label": spec.display}),
            )
        )
    report.step("inputs")
    stored_by = {"commit": report.data.get("commit"), "out": str(out)}
    inputs, cached = cached_inputs(checkpoint, params.images, params.videos, params.text, log, stored_by)
    report.data["inputs"] = {**inputs.summary(), **({"cache": cached} if cached is not None else {})}
    log(f"inputs: {len(params.images)} image(s), {len(params.videos)} video(s), {inputs.headline}")

    tapsets = {}
    compared = {}  # (reference, candidate) label -> comparison rows, from a replay or the background comparer
    report.data["replay"] = {}
    report.data["narrowing"] = {}
    report.data["conclusions"] = {}
    pairing = Pairs(
        full,
        {spec.display: runtime for spec, runtime in runtimes},
        ReferenceCache(),
        params.reference_label,
        params.narrow,
    )
    # the reference first, so each candidate can be replayed on its stage inputs right after its own capture;
    # every model is released after its capture (and replay): peak memory holds one runtime's model at a time
    runtimes.sort(key=lambda item: item[0].display != params.reference_label)
    pairs = [(params.reference_label, spec.display) for spec, _ in runtimes if spec.display != params.reference_label]
    pairs += [(a, b) for a, b in params.pairs if a != params.reference_label]
    # a pair is compared as soon as both sides are captured, next to the next runtime's load and forward
    comparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="driftscope-compare")
    pending = {}
    try:
        for spec, runtime in runtimes:
            capture_one(
                params, report, out, spec, runtime, inputs, plan, contract, tapsets, compared, pairing, log, _log_detail
            )
            teacher_force(inputs, tapsets.get(params.reference_label), contract, params.forced)  # fed its tokens
            for pair in pairs:
                if pair not in pending and pair not in compared and all(label in tapsets for label in pair):
                    pending[pair] = comparer.submit(compare_tapsets, tapsets[pair[0]], tapsets[pair[1]], contract, plan)
        report.step("compare")
        compared.update({pair: future.result() for pair, future in pending.items()})
    finally:
        comparer.shutdown(wait=True, cancel_futures=True)
    reference = tapsets[params.reference_label]
    candidates = [tapset for label, tapset in tapsets.items() if label != params.reference_label]
    extra = [
        (tapsets[a], tapsets[b]) for a, b in params.pairs if a != params.reference_label and {a, b} <= set(tapsets)
    ]
    if pairing.added:  # the run's plan with every stage narrowing added, in execution order
        plan = plan.with_stages(pairing.added, full)
        report.data["stage_plan"] = [stage.to_dict() for stage in plan]
    report.data.update(judge(reference, candidates, contract, plan, extra, compared, pairing.sides))
    report.data["warnings"] = report.data["warnings"] + inputs.warnings  # e.g. a processor unlike its config
    apply_checks(report.data, report.data["checks"])
    apply_yardsticks(report.data, yardsticks(report.data["runtimes"], params.relative, params.reference_label))
    if params.relative:
        from driftscope.judge.relative import peer_verdict, relative_verdict

        rel = params.relative
        if "high" in rel and {rel["high"], rel["oracle"]} <= set(tapsets):  # else one could not run: the verdict says
            others = [t for label, t in tapsets.items() if label not in (rel["high"], rel["oracle"])]
            report.data["relative"] = relative_verdict(
                tapsets[rel["high"]], tapsets[rel["oracle"]], others, plan, rel["factor"], rel["floor"]
            )
        if "peer" in rel:
            report.data["peer_relative"] = peer_verdict(report.rows, reference.label, rel["peer"], contract, plan)
    if params.attribution:
        from driftscope.judge.attribution import attribution_report

        report.data["attribution"] = attribution_report(tapsets, params.attribution, contract, plan, compared)
        log(f"attribution: {report.data['attribution']['verdict']}")
    if params.text:
        from driftscope.judge.answer import answer_parity

        report.data["answer"] = answer_parity(
            checkpoint,
            tapsets,
            params.reference_label,
            params.text["expect"],
            [(p["reference"], p["candidate"]) for p in report.data["pairs"]],
            contract=contract,
            plan=plan,
        )
        explain_answer(params, report, out, pairing.runtimes, inputs, tapsets, contract, plan, log)
    if any((conclusion or {}).get("ready_patches") for conclusion in report.data["conclusions"].values()):
        from driftscope.run.ready_trial import try_ready_patches

        report.step("patch trials")  # the first screen shows each ready patch tried, before and after
        report.data["patch_trials"] = try_ready_patches(report, log)
    report.save()
    if params.power:
        _power(params, report, out, checkpoint, inputs, reference, contract, plan)
    report.data["status"] = "complete"
    report.step("done")
    verdict = report.data["verdict"]
    log(f"verdict: {verdict['status']}" + "".join(f"\n  {reason}" for reason in verdict["reasons"]))
    for warning in report.data.get("warnings") or []:
        log(f"warning: {warning}")
