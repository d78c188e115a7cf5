"""Checks of each runtime's capture beyond its numbers: did it run to the end, on this run's inputs, under the
policy it says, in the dtype the policy declares.

The checks of every runtime go into ``report.json`` (``checks``, by runtime label). A check that fails makes
that runtime's pairs fail; an unreadable or incomplete capture, or a candidate that could not load or capture at
all (``failed``: the engine's error), makes them "could not run", whatever the stages it did write say, and the
other pairs are still judged. ``driftscope show`` and notebook 01 list every check that did not pass.
"""

from __future__ import annotations

from collections import Counter

from driftscope.core.markup import code, text
from driftscope.taps.tapset import TapSet

COULD_NOT_RUN = "could not run"
#: status -> precedence when one runtime pair collects several
_RANK = {"pass": 0, "warn": 0, "fail": 1, COULD_NOT_RUN: 2}


def check(name: str, status: str, detail: str) -> dict:
    return {"check": name, "status": status, "detail": detail}


def unreadable(problem: str) -> list[dict]:
    """The checks of a runtime whose TapSet could not be read at all."""
    return [check("readable", COULD_NOT_RUN, problem)]


def failed(err: BaseException, loaded: bool) -> list[dict]:
    """The checks of a runtime that could not load its model (``loaded`` False) or could not capture with it: the
    engine's own error, and its fix when it gives one."""
    detail = getattr(err, "problem", None) or f"{type(err).__name__}: {err}"
    fix = getattr(err, "fix", None)
    return [check("loaded" if not loaded else "complete", COULD_NOT_RUN, detail + (f" (fix: {fix})" if fix else ""))]


def audit_checks(tapset: TapSet) -> list[dict]:
    """The load audit of the runtime that captured ``tapset`` (``capture.load_audit``, kept in its sidecar): a
    candidate that did not load its checkpoint fails; one whose family declares no layout for it is a warning."""
    record = tapset.meta.get("load_audit")
    if not record:
        return []
    status = {"pass": "pass", "fail": "fail"}.get(record.get("status"), "warn")
    return [check("load_audit", status, str(record.get("detail", "")))]


def declared_policy(meta: dict) -> dict | None:
    """The policy a sidecar declares, as an object (a bare name becomes ``{"name": ...}``); None if it declares none."""
    policy = meta.get("policy")
    if policy is None:
        return None
    return {"name": policy} if isinstance(policy, str) else dict(policy)


_NAMES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16"}


def computed_dtype(tapset: TapSet, stage_id: str) -> str:
    """The dtype a stage's values hold: the narrower of what the capture says it computed in (``native_dtype``) and
    the dtype it is stored in (values stored as BF16 are bfloat16 values, whatever the sidecar declares)."""
    stored = str(tapset.stored_dtype(stage_id)).lower()
    stored = _NAMES.get(stored, stored)
    native = str(tapset.declaration(stage_id).get("native_dtype") or stored).lower()
    native = _NAMES.get(native, native)
    return min((native, stored), key=lambda dtype: _MANTISSA.get(dtype, 64))


def observed_dtypes(tapset: TapSet, everywhere: bool = False) -> dict[str, int]:
    """How many floating stages of the vision tower (``everywhere``: of the whole model, the text side too) were
    computed in each dtype (:func:`computed_dtype`); side and integer stages left out."""
    counts: Counter[str] = Counter()
    for stage_id in tapset.stage_ids():
        declaration = tapset.declaration(stage_id)
        if not (everywhere or stage_id.startswith("vision.")) or declaration.get("side") or declaration.get("integer"):
            continue
        native = computed_dtype(tapset, stage_id)
        if native.startswith(("float", "bfloat")):
            counts[native] += 1
    return dict(sorted(counts.items()))


def capture_checks(tapset: TapSet, inputs_digest: str, policy_label: str | None = None) -> list[dict]:
    """The checks of one captured TapSet. ``policy_label``: the parameter file's policy for an external engine,
    which its sidecar must agree with (None for runtimes that apply their policy themselves)."""
    meta = tapset.meta
    checks = []
    if meta.get("complete") is False or meta.get("error"):
        error = meta.get("error") or "the sidecar says complete: false and gives no error"
        checks.append(check("complete", COULD_NOT_RUN, f"the engine stopped before the end: {error}"))
    else:
        checks.append(check("complete", "pass", "the capture ran to the end"))
    digest = meta.get("inputs_digest")
    if digest is None:
        checks.append(
            check(
                "inputs_digest",
                "fail",
                f"no inputs_digest: nothing shows it ran on this run's inputs ({inputs_digest}); "
                "write the digest docs/tapfile.md defines",
            )
        )
    elif digest != inputs_digest:
        checks.append(
            check("inputs_digest", "fail", f"inputs_digest {digest} is not this run's {inputs_digest}: other inputs")
        )
    else:
        checks.append(check("inputs_digest", "pass", f"ran on this run's inputs ({digest})"))
    policy = declared_policy(meta)
    if policy_label is not None:
        if policy is None:
            checks.append(
                check("policy", "warn", f"the sidecar declares no policy; {policy_label!r} is only a label here")
            )
        elif policy.get("name") != policy_label:
            checks.append(
                check(
                    "policy",
                    "fail",
                    f"the parameter file says policy {policy_label!r}, the sidecar {policy.get('name')!r}: set the "
                    "runtime's policy to the one the engine ran, or fix the sidecar",
                )
            )
        else:
            checks.append(check("policy", "pass", f"the sidecar declares {policy_label!r} as the parameter file does"))
    checks.append(_dtype_check(policy, observed_dtypes(tapset), observed_dtypes(tapset, everywhere=True)))
    return checks


#: how many bits of mantissa each floating dtype keeps: computing in a dtype with fewer than the policy's is narrower
_MANTISSA = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}


def _declared_activations(policy: dict | None) -> str | None:
    """The activation dtype a sidecar's policy declares: its own field, else that of the registered policy it
    names (a sidecar may give only ``policy: f32``)."""
    if not policy:
        return None
    if policy.get("activations"):
        return str(policy["activations"])
    from driftscope.errors import DriftscopeError
    from driftscope.model.policies import get_policy

    try:
        return get_policy(str(policy.get("name"))).activations
    except DriftscopeError:
        return None


def _dtype_check(policy: dict | None, observed: dict[str, int], everywhere: dict[str, int] | None = None) -> dict:
    """Pass when every floating stage of the tower was computed in the policy's activation dtype; fail when any
    model stage (``everywhere``: the text side's too) was computed in a narrower one (fewer mantissa bits: the
    policy's label would hide it); warn when some of the tower's were wider."""
    declared = _declared_activations(policy)
    everywhere = observed if everywhere is None else everywhere
    seen = ", ".join(f"{dtype} ({count} stages)" for dtype, count in observed.items()) or "no floating stages"
    if not declared or not everywhere:
        return check("compute_dtype", "pass", f"computed in {seen}")
    bits = _MANTISSA.get(declared)
    narrower = [dtype for dtype in everywhere if bits is not None and _MANTISSA.get(dtype, bits) < bits]
    if narrower:
        outside = {dtype: count for dtype, count in everywhere.items() if count > observed.get(dtype, 0)}
        beyond = ", ".join(f"{dtype} ({count} stages)" for dtype, count in outside.items() if dtype in narrower)
        return check(
            "compute_dtype",
            "fail",
            f"the policy declares {declared} activations; computed in {seen}"
            + (f" and outside the tower in {beyond}" if beyond else "")
            + f": {', '.join(narrower)} is narrower, so the policy's label does not hold (run the engine under its "
            "policy, or declare the policy it ran; a stage stored narrower holds values no wider than it is stored)",
        )
    if set(observed) - {declared}:
        return check("compute_dtype", "warn", f"the policy declares {declared} activations; computed in {seen}")
    return check("compute_dtype", "pass", f"computed in {seen}, as the policy declares")


def apply_checks(data: dict, checks: dict[str, list[dict]]) -> None:
    """Fold the checks into a judged report's verdict (``data``: the report's fields after ``judge``)."""
    verdict = data["verdict"]
    per_pair = verdict.setdefault("per_candidate", {})
    reasons = verdict.setdefault("reasons", [])
    for label, entries in checks.items():
        bad = [entry for entry in entries if _RANK.get(entry["status"], 1) > 0]
        if not bad:
            continue
        status = max((entry["status"] for entry in bad), key=_RANK.__getitem__)
        keys = [pair["key"] for pair in data.get("pairs", []) if label in (pair["reference"], pair["candidate"])]
        for key in keys or [label]:
            if _RANK[status] > _RANK.get(per_pair.get(key, "pass"), 1):
                per_pair[key] = status
        reasons.extend(f"{label}: {_said(entry)}: {entry['detail']}" for entry in bad)
    worst = max(per_pair.values(), key=lambda status: _RANK.get(status, 1), default="pass")
    if _RANK.get(worst, 1) > 0:  # a runtime that could not run leaves the run unjudged: exit 2, not 1
        verdict["status"] = COULD_NOT_RUN if worst == COULD_NOT_RUN else "fail"


#: what a check that did not pass says of its runtime, in a verdict's reasons
_FAILED = {
    "readable": "its tap file could not be read",
    "loaded": "it did not load",
    "complete": "its capture did not run to the end",
    "inputs_digest": "it ran on other inputs",
    "policy": "its policy is not what the parameter file says",
    "compute_dtype": "it computed in another dtype than its policy declares",
    "load_audit": "it did not load what its checkpoint holds",
}


def _said(entry: dict) -> str:
    """A check that did not pass, in words: "could not run (it did not load)", "check 'policy' warns (...)"."""
    what = _FAILED.get(entry["check"], f"check {entry['check']!r}")
    if entry["status"] == COULD_NOT_RUN:
        return f"could not run ({what})"
    return f"{what} ({entry['status']})" if entry["check"] in _FAILED else f"{what} {entry['status']}s"


def checks_markdown(data: dict, statuses: tuple[str, ...] = ("warn", "fail", COULD_NOT_RUN)) -> str:
    """The checks whose status is one of ``statuses``, one line each (empty when there are none)."""
    lines = [
        f"- {code(label)} {text(entry['check'])}: **{text(entry['status'])}**: {text(entry['detail'])}"
        for label, entries in (data.get("checks") or {}).items()
        for entry in entries
        if entry["status"] in statuses
    ]
    return "\n".join([f"**Runtime checks ({', '.join(statuses)})**", "", *lines]) if lines else ""
