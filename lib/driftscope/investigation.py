"""Orchestration: parameters -> inputs -> each runtime's capture -> compare -> report.json.

The report is written after every step, so a crash leaves a report that says where it stopped.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .checkpoint import open_checkpoint
from .compare import compare_tapsets
from .contract import load_contract
from .environment import current_commit, fingerprint
from .errors import DriftscopeError
from .families import get_family
from .params import Parameters, load_parameters
from .report import Report, judge
from .runlock import RunLock, run_lock
from .runtimes import get_runtime
from .stages import StagePlan

if TYPE_CHECKING:
    from .contract import Contract
    from .inputs import ModelInputs
    from .params import RuntimeSpec
    from .runtimes.base import Runtime
    from .tapset import TapSet

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    """``outputs/<commit>/<name>/`` under the repository root."""
    root = REPO_ROOT if root is None else root
    return root / "outputs" / current_commit(root) / params.name


def investigate(
    params: Parameters | str | Path, out_dir: str | Path | None = None, reuse: bool = False, lock: RunLock | None = None
) -> Report:
    """Run the investigation; with ``reuse``, return a finished report of the same parameters instead.

    One investigation writes into a directory at a time. With ``reuse``, a run of the same directory in
    progress in another process is waited for and its report returned; if it failed, its error is raised
    rather than running it again (so too for a failed run by this process's parent: ``driftscope run``
    runs the investigation itself and starts the notebook's kernel). Without ``reuse``, a run in progress
    is an error. ``lock``: the directory's lock, already held by the caller.
    """
    if not isinstance(params, Parameters):
        params = load_parameters(params)
    out = Path(out_dir) if out_dir else default_out_dir(params)
    with nullcontext(lock) if lock else run_lock(out, wait=reuse, log=log) as held:
        report_path = out / "report.json"
        if reuse and report_path.exists():
            previous = Report.load(report_path)
            if previous.data.get("parameters_digest") == params.digest:
                if previous.data.get("status") == "complete":
                    if held.waited and (out / LOG_NAME).exists():  # show the progress of the run waited for
                        print((out / LOG_NAME).read_text(), end="", flush=True)
                    log(f"reusing the finished run in {out}")
                    return previous
                # the run this process waited for, or the one its parent ran (the CLI that started this kernel)
                if held.waited or previous.data.get("pid") == os.getppid():
                    error = previous.data.get("error") or {}
                    cause = f"{error['type']}: {error['message']}" if error else "no error recorded (killed?)"
                    raise InvestigationFailed(
                        f"the investigation this run waited for stopped at {previous.data.get('stopped_at')}: {cause}",
                        f"see {report_path} and {out / LOG_NAME}; fix the cause and run again",
                    )
        with open(out / LOG_NAME, "w", encoding="utf-8") as log_file:
            _log_files.append(log_file)
            try:
                return _investigate(params, out, report_path)
            finally:
                _log_files.remove(log_file)


def _investigate(params: Parameters, out: Path, report_path: Path) -> Report:
    report = Report.start(
        report_path,
        name=params.name,
        description=params.description,
        commit=current_commit(REPO_ROOT),
        parameters=params.to_dict(),
        parameters_file=params.source,
        parameters_digest=params.digest,
        pid=os.getpid(),
        environment=fingerprint(),
    )
    try:
        _run(params, report, out)
    except BaseException as err:
        report.fail(err)
        log(f"stopped at {report.data['stopped_at']}: {type(err).__name__}: {err}")
        raise
    return report


def _replay_one(report: Report, out: Path, label: str, runtime, reference, candidate, contract, plan) -> list:
    """Replay one candidate on the reference's stage inputs; label stages introduced/inherited/amplified.

    Returns the pair's comparison rows (the accumulated error), which ``judge`` reuses."""
    from .replay import drill_down

    report.step(f"replay:{label}")
    log(f"replay {label} on {reference.label}'s stage inputs")
    accumulated = compare_tapsets(reference, candidate, contract, plan)
    safe = label.replace(":", "-").replace("/", "-")
    drill = drill_down(
        reference,
        runtime,
        accumulated,
        contract,
        plan,
        out / "taps" / f"replay-{safe}",
        label,
        progress=lambda message: log(f"  {label}: {message}"),
    )
    entry = drill.to_dict()
    entry["tapset"] = str(Path(entry["tapset"]).relative_to(out))
    report.data["replay"][label] = entry
    report.save()
    if drill.first_introduced:
        log(f"  {label}: first introduced error at {drill.first_introduced}")
    return accumulated


def _power(params: Parameters, report: Report, out: Path, checkpoint, inputs, reference, contract, plan) -> None:
    """Run the mutation audit and gate the verdict on the mutations the parameters require."""
    from .power import fixture_power, power_gate

    report.step("power")
    names = params.power["mutations"]
    if names == "all":
        names = get_family(checkpoint.family).mutation_registry().names()
        names += [name for name in params.power["require"] if name not in names]
    log(f"fixture power: {len(names)} mutations against {reference.label}")
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
    )
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


def _capture_one(
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
) -> None:
    """One runtime's capture (and replay) into ``tapsets`` and the report; its model is released after."""
    report.step(f"capture:{spec.display}")
    log(f"capture {spec.display}: {len(plan)} stages")
    safe = spec.display.replace(":", "-").replace("/", "-")
    tapset = runtime.capture(
        inputs, plan, out / "taps" / safe, progress=lambda message, label=spec.display: log(f"  {label}: {message}")
    )
    tapsets[spec.display] = tapset
    report.data["runtimes"].append(
        {
            "label": spec.display,
            "runtime": spec.runtime,
            "policy": runtime.policy.to_dict(),
            "patch": tapset.meta.get("patch"),
            "versions": tapset.meta.get("versions"),
            "options": spec.options,
            "tapset": str(tapset.tensor_path.relative_to(out)),
            "timings": tapset.meta.get("timings", {}),
            "artifact": tapset.meta.get("artifact"),
            "bucket": tapset.meta.get("bucket"),
            "stages": len(tapset.stage_ids()),
        }
    )
    report.save()
    log(f"  {spec.display}: done in {runtime.timings.get('capture_s', 0.0):.1f}s")
    if spec.display != params.reference_label and params.replays(spec.display) and runtime.can_replay:
        reference = tapsets[params.reference_label]
        compared[(reference.label, tapset.label)] = _replay_one(
            report, out, spec.display, runtime, reference, tapset, contract, plan
        )
    runtime.release()


def _run(params: Parameters, report: Report, out: Path) -> None:
    report.step("checkpoint")
    checkpoint = open_checkpoint(params.checkpoint, params.family)
    contract = load_contract(params.contract)
    family = get_family(checkpoint.family)
    plan = family.vision_plan(checkpoint.config).select(params.stages)
    if params.text:
        plan = StagePlan(
            plan.family,
            plan.stages + family.text_stages(checkpoint.config, params.text["max_new_tokens"]),
            plan.depth,
            dict(plan.meta),
        )
    report.data.update(
        family=checkpoint.family,
        checkpoint=str(checkpoint.path),
        contract=contract.to_dict(),
        reference=params.reference_label,
        stage_plan=[stage.to_dict() for stage in plan],
        plan_meta={"depth": plan.depth, **plan.meta},
        runtimes=[],
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
    inputs = family.prepare_inputs(checkpoint, params.images)
    if params.text:
        inputs.text = family.text_inputs(checkpoint, inputs, **params.text)
    report.data["inputs"] = inputs.summary()
    log(f"inputs: {len(params.images)} image(s), {inputs.headline}")

    tapsets = {}
    compared = {}  # (reference, candidate) label -> comparison rows, from a replay or the background comparer
    report.data["replay"] = {}
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
            _capture_one(params, report, out, spec, runtime, inputs, plan, contract, tapsets, compared)
            for pair in pairs:
                if pair not in pending and pair not in compared and all(label in tapsets for label in pair):
                    pending[pair] = comparer.submit(compare_tapsets, tapsets[pair[0]], tapsets[pair[1]], contract, plan)
        report.step("compare")
        compared.update({pair: future.result() for pair, future in pending.items()})
    finally:
        comparer.shutdown(wait=True, cancel_futures=True)
    reference = tapsets[params.reference_label]
    candidates = [tapset for label, tapset in tapsets.items() if label != params.reference_label]
    extra = [(tapsets[a], tapsets[b]) for a, b in params.pairs if a != params.reference_label]
    report.data.update(judge(reference, candidates, contract, plan, extra, compared))
    if params.relative:
        from .relative import relative_verdict

        rel = params.relative
        others = [t for label, t in tapsets.items() if label not in (rel["high"], rel["oracle"])]
        report.data["relative"] = relative_verdict(
            tapsets[rel["high"]], tapsets[rel["oracle"]], others, plan, rel["factor"], rel["floor"]
        )
    if params.text:
        from .answer import answer_parity

        report.data["answer"] = answer_parity(
            checkpoint,
            tapsets,
            params.reference_label,
            params.text["expect"],
            [(p["reference"], p["candidate"]) for p in report.data["pairs"]],
        )
    report.save()
    if params.power:
        _power(params, report, out, checkpoint, inputs, reference, contract, plan)
    report.data["status"] = "complete"
    report.step("done")
    verdict = report.data["verdict"]
    log(f"verdict: {verdict['status']}" + "".join(f"\n  {reason}" for reason in verdict["reasons"]))
