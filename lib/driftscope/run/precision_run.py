"""``driftscope precision``: search a failing half-precision candidate of a finished run for the fewest operators
to keep in float32 (``replay.precision``), write the answer into the run's report (``precision``) and as a
precision policy file, and verify it with a real run of that policy (the reference and the candidate again).

Nothing of the run is captured again except the candidate's probes; the reference's taps are the run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from driftscope.capture.patches import HypothesisPatch
from driftscope.core.names import safe_name
from driftscope.errors import ParameterError
from driftscope.families.capabilities import PrecisionCapabilities, capabilities_of
from driftscope.judge.contract import Contract
from driftscope.replay.precision import Candidate, PrecisionSearch
from driftscope.replay.recapture import RERUN
from driftscope.run.params import parameter_root, parse_parameters
from driftscope.run.patch_trial import _full_plan, _inputs, _pair
from driftscope.run.report import Report

FOLDER = "precision"


def dump_yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def _runtime(report: Report, spec: dict, extra: dict | None = None):
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import open_checkpoint

    checkpoint = open_checkpoint(report.data["checkpoint"], report.data.get("family"))
    own = spec.get("patch")
    patch = None if own is None else HypothesisPatch(own["callable"], dict(own.get("kwargs") or {}))
    options = {**(spec.get("options") or {}), "label": spec["label"], **(extra or {})}
    return get_runtime(spec["runtime"])(checkpoint, spec["policy"], patch, options)


def _judged(report: Report, plan, pair: str) -> list[str]:
    """The image-path stages the run compared for ``pair`` that a probe changes: block outputs and the tower's
    float stages (not the substages narrowing added, not the processor's, the index math or the text side)."""
    compared = {row.stage for row in report.rows if (row.pair or row.candidate) == pair}
    return [
        stage.id
        for stage in plan
        if stage.id in compared
        and not stage.id.startswith(("inputs.", "text."))
        and stage.substage is None
        and not stage.integer
        and not stage.data
    ]


def _outside(report: Report, pair: str, judged: list[str]) -> list[str]:
    """What fails the pair outside the stages a probe judges (the text side, the index math, a failed check or
    coverage): no float32 operator of the image path is known to change it."""
    inside = set(judged)
    found = [
        row.stage
        for row in report.rows
        if (row.pair or row.candidate) == pair
        and (row.failed or row.status == "not_judged")
        and row.stage not in inside
        and not row.stage.startswith("vision.")  # a narrowed substage of the image path: its block is judged
    ]
    label = next((p["candidate"] for p in report.data.get("pairs", []) if p["key"] == pair), pair)
    checks = (report.data.get("checks") or {}).get(label) or []
    found += [f"the {c['check']} check" for c in checks if c.get("status") not in ("pass", "warn")]
    found += list(((report.data.get("coverage") or {}).get(pair) or {}).get("problems") or [])
    return found


def _candidate(report: Report, spec: dict, inputs, log) -> Candidate:
    runtime = _runtime(report, spec)
    own = report.tapset(spec["label"])
    if (spec.get("options") or {}).get("f32"):
        raise ParameterError(
            f"{spec['label']} runs a mixed policy already (options.f32: {spec['options']['f32']})",
            "search the candidate with its plain half-precision policy",
        )
    if getattr(runtime, "keep_float32", None) and runtime.can_replay:
        runtime.load()
        log(f"{spec['label']}: each probe widens operators in place and re-runs from the run's stored stages")
        return Candidate(runtime, own, widen=runtime.keep_float32, inputs=inputs, way=RERUN)
    log(f"{spec['label']}: each probe is a forward of a fresh runtime with those operators in float32")
    return Candidate(
        runtime, own, fresh=lambda ids: _runtime(report, spec, {"f32": list(ids)}), inputs=inputs, way="forward"
    )


def precision_search(
    run: str | Path | Report, candidate: str, verify: bool = True, log: Callable[[str], None] = print
) -> dict:
    """Search ``candidate`` (a runtime label of the run) for the fewest operators to keep in float32; write
    ``report.json``'s ``precision.<candidate>`` and ``precision/<candidate>.policy.yaml``; with ``verify``, run
    the policy for real (``precision/<candidate>.verify/``). Returns the report's entry."""
    from driftscope.families import get_family

    start = time.perf_counter()
    report = run if isinstance(run, Report) else Report.load(run)
    if report.status != "complete":
        raise ParameterError(f"the run in {report.directory} has not finished", "run it first: driftscope run PARAMS")
    reference, label = _pair(report, candidate)
    spec = report.runtime_spec(label)
    verdict = (report.data.get("verdict") or {}).get("per_candidate", {}).get(label)
    plan = _full_plan(report)
    family = get_family(plan.family)
    operators = family.precision_operators(spec["runtime"], plan)
    if not operators:
        raise ParameterError(
            f"no operator of {spec['runtime']} can be kept in float32 for the {family.name} family",
            "search a candidate on a runtime the family's precision module covers (mlx, iree, jax)",
        )
    inputs = _inputs(report)
    out = report.directory / FOLDER / safe_name(label)
    found = _candidate(report, spec, inputs, log)
    judged = _judged(report, plan, candidate)
    rows = {row.stage: row for row in report.rows if (row.pair or row.candidate) == candidate}
    written = report.data["contract"]
    contract = Contract.from_dict({k: v for k, v in written.items() if k != "source"}, written.get("source"))
    log(f"precision search of {label} ({verdict}): {len(operators)} operator kinds, {plan.depth} blocks")
    fixed = [stage for stage in judged if not family.replay_inputs(stage, plan)]  # no operator changes them
    search = PrecisionSearch(found, report.tapset(reference), plan, judged, rows, contract, out / "probes", log, fixed)
    try:
        result = search.run(operators)
    finally:
        found.runtime.release()
    entry = {
        "candidate": label,
        "reference": reference,
        "runtime": spec["runtime"],
        "policy": spec["policy"],
        "verdict_before": verdict,
        "way": found.way,
        "judged": judged,
        "operator_kinds": operators,
        "text": capabilities_of(family.precision_module(), PrecisionCapabilities).text_reason,
        **result.to_dict(),
        "run_seconds": _run_seconds(report),
    }
    entry["ratio"] = entry["seconds"] / entry["run_seconds"] if entry["run_seconds"] else None
    outside = _outside(report, candidate, judged) if verdict != "pass" else []
    entry["outside"] = outside
    if outside and result.closes and not result.answer:  # everything it can judge passes: the failure is elsewhere
        entry.update(closes=False, limit="outside")
        entry["message"] = (
            f"the candidate fails outside what the search can widen: {', '.join(outside[:3])}"
            + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
            + " (it keeps operators of the image path in float32 and judges the image path's stages, which pass)"
        )
    elif outside:
        entry["message"] += (
            f"; outside what it widens the run also fails at {', '.join(outside[:3])}: only the real run of the "
            "policy says whether that follows"
        )
    if not entry["closes"] and entry.get("limit") == "defect":  # a patch for a defect, not for storage
        entry["defect_patches"] = _defect_patches(family, spec, result)
        if entry["defect_patches"]:
            entry["message"] += f"; patches the family declares for it: {', '.join(entry['defect_patches'])}"
    if entry["closes"] and result.answer:
        policy = {"base": spec["policy"], "f32": result.answer}
        entry["policy_file"] = str(_write_policy(report, spec, policy, entry).relative_to(report.directory))
        entry["mixed_policy"] = policy
        if verify:
            entry["verified"] = _verify(report, reference, spec, policy, out, log)
    entry["total_seconds"] = time.perf_counter() - start
    report.data.setdefault("precision", {})[label] = entry
    report.save()
    log(f"precision: {entry['message']}")
    return entry


def run_of(params, given: str, out: Path, log: Callable[[str], None] = print) -> Report:
    """The finished run of ``params`` (the parameter file ``given``) in ``out``, its investigation run first where
    there is none (its notebooks are not rendered); a run of another parameter file (``--run``) is a
    :class:`ParameterError`."""
    if not (out / "report.json").exists():  # the run the search starts from: made now
        from driftscope.run.investigation import investigate

        log(f"no run of {given} in {out}: running its investigation first")
        investigate(params, out, reuse=True)
    report = Report.load(out / "report.json")
    if report.data.get("parameters_digest") != params.digest:
        raise ParameterError(
            f"the run in {out} is not a run of {given} (it ran {report.data.get('parameters_file')})",
            f"pass the parameter file that run used, or --run a run of {given} (driftscope run it first)",
        )
    return report


def precision_exit_code(entry: dict, log: Callable[[str], None]) -> int:
    """0: a set of float32 operators closes the failure and the real run of its policy passes (unverified: and
    nothing fails outside what the search judged); 1 otherwise."""
    verified = entry.get("verified") or {}
    if verified:
        log(f"verified by a real run: {verified['label']} {verified['verdict']} ({verified['report']})")
        return 0 if entry["closes"] and verified["verdict"] == "pass" else 1
    return 0 if entry["closes"] and not entry.get("outside") else 1  # a failure it did not judge is no pass


def _defect_patches(family, spec: dict, result) -> list[str]:
    """When no float32 set closes it: the ready patches the family declares for the stage still failing with every
    operator in float32, and its known-defect fixes for the runtime, unless the candidate runs that patch already."""
    failing = result.probes[-1].first_failure if result.probes else None
    found = family.ready_patches(failing, spec["runtime"], activations="float32") if failing else []  # all in f32
    known = family.known_defects.get(spec["runtime"])
    if known and known not in found:
        found.append(known)
    applied = spec.get("patch") or {}
    applied = applied.get("callable") if isinstance(applied, dict) else applied
    return [name for name in found if name != applied]


def _run_seconds(report: Report) -> float | None:
    """The run's own wall time (created to its last step)."""
    from datetime import datetime

    done = [step["at"] for step in report.data.get("progress", []) if step.get("step") == "done"]
    if not done or not report.data.get("created"):
        return None
    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    return (parse(done[-1]) - parse(report.data["created"])).total_seconds()


def _write_policy(report: Report, spec: dict, policy: dict, entry: dict) -> Path:
    path = report.directory / FOLDER / f"{safe_name(spec['label'])}.policy.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "runtime": spec["runtime"],
        "label": f"{spec['label']}+f32",
        "policy": policy,
        **({"options": spec["options"]} if spec.get("options") else {}),
        **({"patch": spec["patch"]} if spec.get("patch") else {}),
    }
    header = (
        f"# driftscope precision: the fewest operators of {spec['label']} to keep in float32 so it passes:\n"
        f"# {entry['message']}\n# ({len(entry['probes']) - 1} probes in {entry['seconds']:.1f} s). A runtime entry: "
        "paste it under `runtimes:` of a parameter file.\n"
    )
    path.write_text(header + dump_yaml(body))
    return path


def _absolute(data: dict, base: Path) -> dict:
    def resolve(value):
        return value if not isinstance(value, str) or Path(value).is_absolute() or "://" in value else str(base / value)

    data = dict(data)
    for key in ("checkpoint", "contract"):
        if data.get(key):
            data[key] = resolve(data[key])
    data["images"] = [resolve(image) for image in data.get("images") or []]
    return data


def _verify(report: Report, reference: str, spec: dict, policy: dict, out: Path, log) -> dict:
    """A real run of the reference and the candidate under the mixed policy: its verdict and worst stage."""
    from driftscope.run.investigation import investigate

    written = dict(report.data["parameters"])
    source = report.data.get("parameters_file")
    base = parameter_root(source) if source and Path(source).exists() else Path.cwd()
    runtimes = {entry["label"]: entry for entry in written["runtimes"]}
    mixed = {**runtimes[spec["label"]], "label": f"{spec['label']}+f32", "policy": policy}
    mixed = {key: value for key, value in mixed.items() if value is not None}
    data = {
        **_absolute(written, base),
        "name": f"{written['name']}-precision",
        "runtimes": [{k: v for k, v in runtimes[reference].items() if v is not None}, mixed],
        "reference": reference,
        "pairs": [],
        "notebooks": [],
        "power": None,
    }
    params_path = out.with_suffix(".verify.yaml")
    params_path.write_text(dump_yaml({k: v for k, v in data.items() if v is not None}))
    log(f"verifying {mixed['label']}: a real run of {params_path.name}")
    start = time.perf_counter()
    verified = investigate(parse_parameters(data, str(params_path), base), out.with_suffix(".verify"))
    per = (verified.data.get("verdict") or {}).get("per_candidate", {})
    failing = [row for row in verified.rows if row.failed]
    return {
        "label": mixed["label"],
        "verdict": per.get(mixed["label"], verified.verdict),
        "report": str((verified.directory / "report.json").relative_to(report.directory)),
        "parameters": str(params_path.relative_to(report.directory)),
        "first_failure": failing[0].stage if failing else None,
        "stages": len(verified.rows),
        "seconds": time.perf_counter() - start,
    }
