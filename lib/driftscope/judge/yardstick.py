"""Yardsticks: runtimes a run holds to measure the others by, not to gate.

A runtime is a yardstick when its policy says it is one (``tf32``: how far a GPU oracle's own TF32 matmuls would be;
``f64``: the high-precision side the oracle's own error is measured against) or the parameter file's ``relative``
names it (``high``, ``peer``: the trusted peer every other candidate is judged against). A yardstick's pairs are
judged and shown as every other pair, labelled as yardsticks, and never counted among the failing pairs: the
verdict's status is the other pairs' (``verdict.yardsticks`` says which pairs were left out and why).
"""

from __future__ import annotations

#: policy name -> why a runtime under it is a yardstick
POLICIES = {
    "tf32": "TF32 oracle: how far a GPU oracle's own TF32 matmuls would be",
    "f64": "float64: the high-precision side the float32 oracle's own error is measured against",
}
#: ``relative`` key -> why the runtime it names is a yardstick
RELATIVE = {
    "high": "float64: the high-precision side the float32 oracle's own error is measured against",
    "peer": "the trusted peer every other candidate is judged against (relative: peer)",
}


def yardsticks(runtimes: list[dict], relative: dict | None, reference: str | None = None) -> dict[str, str]:
    """Runtime label -> why it is a yardstick, for the run's ``runtimes`` (``label`` and ``policy`` each) and its
    ``relative`` section; the reference is never one (every pair is measured against it)."""
    found: dict[str, str] = {}
    for runtime in runtimes:
        policy = runtime.get("policy")
        name = policy.get("name") if isinstance(policy, dict) else policy
        if name in POLICIES:
            found[runtime["label"]] = POLICIES[name]
    for key, why in RELATIVE.items():
        label = (relative or {}).get(key)
        if label:
            found.setdefault(label, why)
    found.pop(reference, None)
    return found


def pair_yardstick(key: str, pairs: list[dict], marked: dict[str, str]) -> str | None:
    """Why pair ``key`` is a yardstick's (its candidate, or either side of an extra pair, is one), else None."""
    pair = next((p for p in pairs if p.get("key") == key), {"candidate": key, "reference": None})
    return marked.get(pair.get("candidate")) or marked.get(pair.get("reference"))


def apply_yardsticks(data: dict, marked: dict[str, str]) -> None:
    """Mark the yardstick pairs in ``data["verdict"]`` (``yardsticks``: pair -> why) and take them out of its status
    and of its counted reasons (their reasons are kept, said as a yardstick's). In place."""
    verdict = data.get("verdict") or {}
    per_pair = verdict.get("per_candidate") or {}
    pairs = data.get("pairs") or []
    left_out = {key: why for key in per_pair if (why := pair_yardstick(key, pairs, marked))}
    if not left_out:
        return
    verdict["yardsticks"] = left_out
    reasons = []
    for reason in verdict.get("reasons") or []:
        key = reason.split(": ", 1)[0]
        reasons.append(f"{reason} (a yardstick, not counted)" if key in left_out else reason)
    verdict["reasons"] = reasons
    from driftscope.capture.runtime_checks import _RANK, COULD_NOT_RUN

    counted = [status for key, status in per_pair.items() if key not in left_out]
    worst = max(counted, key=lambda status: _RANK.get(status, 1), default="pass")
    verdict["status"] = (COULD_NOT_RUN if worst == COULD_NOT_RUN else "fail") if _RANK.get(worst, 1) > 0 else "pass"
