"""The answer token by token, teacher-forced: each candidate was fed the reference's greedy tokens, so its
``text.forced.logits`` row ``i`` and the reference's are the same question (the reference's first ``i`` tokens
after the prompt) and every step can be compared, not only the steps before the first differing token.

Per step and pair:

- **Top-k tolerance maps.** The candidate's error on the reference's top-k tokens, k = 5, 50, 1000 and all, each
  under its own contract tolerance (``text.forced.top5``, ``text.forced.top50``, ``text.forced.top1000``,
  ``text.forced.all``; a contract without the key uses its default). A step fails a k when more than
  ``max_failure_fraction`` of those k tokens have ``|c - r| > atol + rtol * |r|``, or a non-finite value the
  reference lacks. The first step that fails any k is the answer's **first divergence** (teacher-forced),
  whether or not the argmax flipped there.
- **Flips a precision can explain.** A step *flips* when the candidate's argmax ``t`` is not the reference's
  top-1 ``a``. Its reference margin is ``m = r[a] - r[t]`` (the top-1 minus top-2 margin when ``t`` is the
  reference's second); the error the candidate may make on that margin is
  ``allowed = tol(r[a]) + tol(r[t])``, ``tol(x) = atol + rtol * |x|`` under ``text.forced.top5``, but never less
  than one unit of least precision of each value in the candidate policy's activation dtype. The flip is a
  **near-tie** when ``m <= allowed`` (a precision the contract allows could flip it) and **confident** when
  ``m > allowed`` (the candidate's error at those two tokens is more than its policy allows: evidence of a defect).
"""

from __future__ import annotations

import math

import numpy as np

from driftscope.core.numeric import margin_band
from driftscope.judge.contract import FORCED_KEYS, Contract, Tolerance
from driftscope.taps.tapset import TapSet

FORCED = "text.forced.logits"


def activation_dtype(tapset: TapSet) -> str:
    """The dtype the runtime's policy computes activations in, from its sidecar (float32 when not said)."""
    policy = tapset.meta.get("policy")
    if isinstance(policy, dict):
        return str(policy.get("activations") or "float32")
    return "float32"


def _step_fails(error: np.ndarray, bound: np.ndarray, bad: np.ndarray, tolerance: Tolerance) -> tuple[int, bool]:
    failures = int(np.count_nonzero((error > bound) | bad))
    allowed = int(math.floor(tolerance.max_failure_fraction * error.size))
    return failures, bool(bad.any()) or failures > allowed


def forced_pair(reference: TapSet, candidate: TapSet, contract: Contract) -> dict | None:
    """The teacher-forced comparison of one pair (None when either side has no forced logits)."""
    if FORCED not in reference or FORCED not in candidate:
        return None
    shape = tuple(reference.shape(FORCED))
    if shape != tuple(candidate.shape(FORCED)) or len(shape) != 2:
        return {
            "status": "shape_mismatch",
            "note": f"forced logits {list(shape)} vs {list(candidate.shape(FORCED))}",
            "first_divergence": None,
            "steps": [],
            "flips": [],
        }
    fed = _fed_tokens(reference, candidate)
    tolerances = {key: contract.tolerance(key) for key in FORCED_KEYS.values()}
    top5 = tolerances[FORCED_KEYS[5]]
    dtype = activation_dtype(candidate)
    steps, flips = [], []
    for index in range(shape[0]):  # one step's row at a time, read from disk: never the whole [steps, vocab]
        r = np.asarray(reference.rows(FORCED, index, index + 1)[0], dtype=np.float64)
        c = np.asarray(candidate.rows(FORCED, index, index + 1)[0], dtype=np.float64)
        order = np.argsort(-r, kind="stable")
        step = {"step": index, "topk": {}}
        for k, key in FORCED_KEYS.items():
            chosen = order if k is None else order[: min(k, r.size)]
            rk, ck = r[chosen], c[chosen]
            tolerance = tolerances[key]
            bad = np.isfinite(rk) & ~np.isfinite(ck)
            error = np.abs(ck - rk)
            bound = tolerance.bound(rk)
            failures, failed = _step_fails(np.where(bad, 0.0, error), bound, bad, tolerance)
            finite = error[np.isfinite(error)]
            used = (finite / np.maximum(bound[np.isfinite(error)], 1e-300)) if finite.size else finite
            step["topk"][key] = {
                "max_abs": float(finite.max()) if finite.size else None,
                "failures": failures,
                "tolerance_used": float(used.max()) if used.size else None,
                "status": "fail" if failed else "pass",
            }
        a, b = int(order[0]), int(order[1]) if r.size > 1 else int(order[0])
        top = int(np.argmax(c)) if np.isfinite(c).any() else -1
        margin = float(r[a] - r[b])
        allowed = _allowed(r[a], r[b], top5, dtype)
        step.update(
            reference_top1=a,
            reference_top2=b,
            candidate_top1=top,
            reference_margin=margin,
            candidate_margin=float(c[a] - c[b]),
            error_top1=float(c[a] - r[a]),
            error_top2=float(c[b] - r[b]),
            allowed=allowed,
            flipped=top != a,
        )
        if top != a:
            won = top if top >= 0 else b
            flip_margin = float(r[a] - r[won])
            flip_allowed = _allowed(r[a], r[won], top5, dtype)
            label = "near-tie" if flip_margin <= flip_allowed else "confident"
            step["label"] = label
            flips.append(
                {
                    "step": index,
                    "reference_token": a,
                    "candidate_token": top,
                    "reference_margin": flip_margin,
                    "allowed": flip_allowed,
                    "error": float((c[won] - r[won]) - (c[a] - r[a])),
                    "label": label,
                }
            )
        steps.append(step)
    firsts = {
        key: next((s["step"] for s in steps if s["topk"][key]["status"] == "fail"), None)
        for key in FORCED_KEYS.values()
    }
    failing = [(step, key) for key, step in firsts.items() if step is not None]
    first = min(failing, key=lambda item: item[0]) if failing else None
    return {
        "status": "fail" if first is not None or fed is False else "pass",
        "fed_reference_tokens": fed,
        "steps_compared": len(steps),
        "first_divergence": None if first is None else first[0],
        "first_divergence_by": None if first is None else [key for key, step in firsts.items() if step == first[0]],
        "first_failing_step": firsts,
        "tolerances": {key: {"atol": t.atol, "rtol": t.rtol} for key, t in tolerances.items()},
        "activation_dtype": dtype,
        "rule": "near-tie when r[a] - r[t] <= tol(r[a]) + tol(r[t]) (tol: text.forced.top5, at least 1 ulp each)",
        "flips": flips,
        "confident_flips": sum(1 for flip in flips if flip["label"] == "confident"),
        "steps": steps,
    }


def _allowed(top: float, other: float, tolerance: Tolerance, dtype: str) -> float:
    """The error a candidate may make on the margin between two reference logits (``core.numeric.margin_band``)."""
    return margin_band(top, other, tolerance.atol, tolerance.rtol, dtype)


def _fed_tokens(reference: TapSet, candidate: TapSet) -> bool | None:
    """Whether the candidate was fed what the reference was: the reference's own forced tokens where it was
    teacher-forced too (a pair of two candidates, both fed the oracle's answer), else its greedy tokens (None when
    either side does not say)."""
    said_stage = "text.forced.tokens" if "text.forced.tokens" in reference else "text.generate.tokens"
    if "text.forced.tokens" not in candidate or said_stage not in reference:
        return None
    fed = np.asarray(candidate["text.forced.tokens"]).reshape(-1)
    said = np.asarray(reference[said_stage]).reshape(-1)
    return bool(fed.shape == said.shape and np.array_equal(fed, said))
