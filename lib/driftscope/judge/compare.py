"""Stage-by-stage comparison of two TapSets under a contract: metrics as plain rows.

Metrics live here; orchestration lives in ``investigation``. Rows can be recomputed from saved
TapSets under another contract without re-running any runtime (``compare_tapsets`` again).
"""

from __future__ import annotations

import numpy as np

from driftscope.core.numeric import top2_margin
from driftscope.judge.accumulator import CHUNK_ELEMENTS, Accumulator, json_float, scratch
from driftscope.judge.bounds import RotaryBound, bound_record, derived_bound
from driftscope.judge.contract import Contract, Tolerance
from driftscope.judge.coverage import JUDGED_FLOOR, judged_share
from driftscope.judge.layout import align, count, paired_segments, take_rows
from driftscope.judge.near_tie import settle_near_ties
from driftscope.judge.rows import ComparisonRow, first_divergence, growth_stages, rows_frame  # noqa: F401 - re-exported
from driftscope.judge.traversal import judge_traversal, traversal_order
from driftscope.taps.stages import StagePlan, TokenOrder, orders_of
from driftscope.taps.tapset import TapSet

#: What a data stage's row says: why it has no tolerance and no op-local replay.
DATA_NOTE = "data (inputs or index math): compared exactly, not replayed"


def compare_stage(
    stage_id: str,
    reference: TapSet,
    candidate: TapSet,
    tolerance: Tolerance,
    position: int,
    orders: dict[str, TokenOrder] | None = None,
    integer: bool = False,
    data: bool = False,
    derived: RotaryBound | None = None,
) -> ComparisonRow:
    """Compare one stage of two TapSets; never raises for data problems (they go in the row).

    Each side contributes its declared active rows; sides in different token orders are brought to raster
    order first (``layout``, with ``orders``: the plan's non-raster token orders, ``stages.orders_of``), and
    an order's index and segment bounds are judged by their meaning (``traversal``).

    ``integer``: the stage plan declares the stage integer (compared exactly); ``data``: the plan declares it data
    (inputs, index math: compared exactly, never replayed). A TapSet's sidecar never decides this: a sidecar
    claiming ``integer`` for a float stage would switch the tolerance off.

    ``derived``: a bound derived from the stage's arithmetic (``judge.bounds``, from the plan's declaration), added
    to the contract's at each element; the row says which of the two judged it."""
    row = ComparisonRow(
        stage_id, reference.label, candidate.label, position, "pass", atol=tolerance.atol, rtol=tolerance.rtol
    )
    if tolerance.skip:
        row.status, row.note = "skipped", "skipped by the contract"
        row.max_abs = row.rms = row.mean_abs = row.cosine = row.relative_rms = float("nan")  # nothing judged
        row.tolerance_used = None
        return row
    if stage_id not in reference or stage_id not in candidate:
        side = "reference" if stage_id not in reference else "candidate"
        row.status, row.note = "missing", f"not captured by the {side}"
        row.max_abs = row.rms = row.mean_abs = row.cosine = row.relative_rms = float("nan")  # nothing compared
        row.tolerance_used = None
        return row
    row.integer = bool(integer)
    stored_ref, stored_cand = reference.shape(stage_id), candidate.shape(stage_id)
    row.reference_shape, row.candidate_shape = list(stored_ref), list(stored_cand)
    orders = orders or {}
    alignment = align(stage_id, reference, candidate, orders)
    ref_shape = (count(alignment.reference_rows), *stored_ref[1:]) if stored_ref else ()
    cand_shape = (count(alignment.candidate_rows), *stored_cand[1:]) if stored_cand else ()
    if ref_shape != cand_shape or alignment.refusal:
        row.status = "layout_mismatch" if alignment.refusal else "shape_mismatch"
        active = "" if (ref_shape, cand_shape) == (stored_ref, stored_cand) else " (active rows)"
        row.note = alignment.refusal or (
            f"shapes differ{active}: reference {list(ref_shape)} vs candidate {list(cand_shape)}"
        )
        row.failures = row.elements = int(max(np.prod(ref_shape), np.prod(cand_shape)))
        row.failure_fraction = 1.0
        return row
    if row.integer or data:
        row = _compare_integer(
            row,
            take_rows(reference[stage_id], alignment.reference_rows),
            take_rows(candidate[stage_id], alignment.candidate_rows),
        )
        traversed = traversal_order(orders, stage_id)
        if traversed is not None and row.failures:
            row = _judge_traversal(row, reference, candidate, traversed)
        if data:
            row.note = "; ".join(filter(None, [row.note, DATA_NOTE]))
        return row
    if stage_id.startswith("text.logits"):
        row.extra.update(logit_agreement(np.asarray(reference[stage_id]), np.asarray(candidate[stage_id])))

    accumulator = Accumulator(tolerance)
    row.note = alignment.note
    derived = None if alignment.reorders or not stored_ref else derived
    if alignment.reorders:  # whole arrays, in raster order: coordinates are raster coordinates of the active rows
        expected, actual = alignment.arrays(reference, candidate, stage_id)
        accumulator.add(expected, actual, 0)
        return _finish(row, accumulator, ref_shape, tolerance)
    inner = int(np.prod(stored_ref[1:])) if len(stored_ref) > 1 else 1
    step = max(1, CHUNK_ELEMENTS // max(inner, 1))
    if len(stored_ref) == 0:
        accumulator.add(reference[stage_id], candidate[stage_id], 0)
    else:
        for ref_start, cand_start, length in paired_segments(alignment.reference_rows, alignment.candidate_rows):
            for chunk in range(0, length, step):
                rows = min(step, length - chunk)
                size = rows * inner * 8  # enough for any stored dtype (F16/BF16 widen in place: 6 bytes)
                a, b = ref_start + chunk, cand_start + chunk
                expected = reference.rows_into(stage_id, a, a + rows, scratch.raw_bytes(0, size))
                actual = candidate.rows_into(stage_id, b, b + rows, scratch.raw_bytes(1, size))
                extra = None if derived is None else derived.rows(expected, a)
                accumulator.add(expected, actual, a * inner, extra)
    row = _finish(row, accumulator, stored_ref, tolerance)
    row.bound, row.bound_detail = bound_record(
        derived, accumulator.contract_failures, accumulator.failures - accumulator.mismatch
    )
    return row


def _judge_traversal(row: ComparisonRow, reference: TapSet, candidate: TapSet, order: TokenOrder) -> ComparisonRow:
    """An order's index and segment bounds judged by their meaning: another order of the same segments passes."""
    traversal = judge_traversal(reference, candidate, order)
    if traversal is None or traversal.status == "equal":
        return row
    row.extra["traversal"] = traversal.status
    row.note = traversal.note
    if traversal.status == "equivalent":  # the elements differ, but not in meaning: none of them is a failure
        row.status, row.failures, row.failure_fraction = "pass", 0, 0.0
    else:
        row.status = "fail"
    return row


def logit_agreement(expected: np.ndarray, actual: np.ndarray, k: int = 5) -> dict:
    """Top-1 agreement, top-k overlap and each side's top-1 minus top-2 margin (near-ties show)."""

    def top(values: np.ndarray) -> np.ndarray:
        return np.argsort(values, kind="stable")[::-1][:k]

    ref_top, cand_top = top(expected), top(actual)
    return {
        "top1_reference": int(ref_top[0]),
        "top1_candidate": int(cand_top[0]),
        "top1_agree": bool(ref_top[0] == cand_top[0]),
        f"top{k}_overlap": len(set(ref_top.tolist()) & set(cand_top.tolist())) / k,
        "margin_reference": top2_margin(expected),
        "margin_candidate": top2_margin(actual),
    }


def _compare_integer(row: ComparisonRow, expected: np.ndarray, actual: np.ndarray) -> ComparisonRow:
    """Exact equality of the stored values (a side stored as floats is not truncated: 2.5 is not 2)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    diff = expected != actual
    row.elements = int(expected.size)
    row.failures = int(diff.sum())
    row.failure_fraction = row.failures / row.elements if row.elements else 0.0
    delta = np.abs(expected.astype(np.float64) - actual.astype(np.float64)).ravel()
    row.max_abs = float(delta.max()) if delta.size else 0.0
    row.rms = float(np.sqrt(np.mean(delta.astype(np.float64) ** 2))) if delta.size else 0.0
    row.mean_abs = float(delta.mean()) if delta.size else 0.0
    row.cosine = 1.0 if row.failures == 0 else float("nan")
    row.tolerance_used = 0.0 if row.failures == 0 else float("inf")  # exact: any difference is past it
    if row.failures:
        flat = int(np.flatnonzero(diff.ravel())[0])
        row.max_index = flat
        row.max_coords = [int(c) for c in np.unravel_index(flat, expected.shape)]
        row.max_reference_value = float(expected.ravel()[flat])
        row.max_candidate_value = float(actual.ravel()[flat])
        row.status = "fail"
        row.note = "integer stage must be equal"
    return row


def _finish(row: ComparisonRow, acc: Accumulator, shape: tuple[int, ...], tol: Tolerance) -> ComparisonRow:
    """Metrics over the elements finite on both sides; non-finite disagreements fail the stage whatever
    ``max_failure_fraction`` allows, and the worst element is then the first of them."""
    nan = float("nan")
    finite = acc.finite
    row.elements = acc.elements
    row.failures = acc.failures
    row.failure_fraction = acc.failures / acc.elements if acc.elements else 0.0
    row.max_abs = max(acc.max_abs, 0.0) if finite else (0.0 if not acc.elements else nan)
    row.rms = float(np.sqrt(acc.sum_sq / finite)) if finite else (0.0 if not acc.elements else nan)
    row.mean_abs = acc.sum_abs / finite if finite else (0.0 if not acc.elements else nan)
    row.reference_rms = float(np.sqrt(acc.norm_e / finite)) if finite else (0.0 if not acc.elements else nan)
    if not finite and acc.elements:
        row.relative_rms = nan
    else:
        row.relative_rms = (
            row.rms / row.reference_rms if row.reference_rms > 0 else (0.0 if row.rms == 0 else float("inf"))
        )
    row.max_excess = acc.max_excess
    row.tolerance_used = float("inf") if acc.mismatch else acc.tolerance_used
    denominator = np.sqrt(acc.norm_a) * np.sqrt(acc.norm_e)
    if denominator > 0:
        row.cosine = float(acc.dot / denominator)
    elif not finite and acc.elements:
        row.cosine = nan  # nothing finite to compare: never a perfect 1.0
    else:
        row.cosine = 1.0 if acc.norm_a == acc.norm_e else 0.0
    row.nonfinite_reference, row.nonfinite_candidate = acc.nonfinite_e, acc.nonfinite_a
    row.nonfinite_mismatch, row.nonfinite_both = acc.mismatch, acc.both
    if acc.max_index is not None and shape:
        row.max_index = acc.max_index
        row.max_coords = [int(c) for c in np.unravel_index(acc.max_index, shape)]
        row.max_reference_value, row.max_candidate_value = acc.max_values
    row.status = "fail" if row.failure_fraction > tol.max_failure_fraction else "pass"
    if row.status == "pass" and acc.failures and tol.max_failure_fraction:
        row.note = f"{acc.failures} failures within the allowed fraction {tol.max_failure_fraction}"
    row.atol_bound_failures = acc.atol_bound
    if acc.worst is not None and shape:
        index, reference, candidate, bound = acc.worst
        row.worst_failing = {
            "index": index,
            "coords": [int(c) for c in np.unravel_index(index, shape)],
            "reference": reference,
            "candidate": candidate,
            "tolerance": bound,
            "excess": acc.max_excess,
        }
    if acc.first_nonfinite is not None:
        index, reference, candidate = acc.first_nonfinite
        coords = [int(c) for c in np.unravel_index(index, shape)] if shape else []
        row.first_nonfinite = {
            "index": index,
            "coords": coords,
            "reference": json_float(reference),
            "candidate": json_float(candidate),
        }
        row.status = "fail"
        row.max_abs = float("inf")
        row.max_index, row.max_coords = index, coords
        row.max_reference_value, row.max_candidate_value = reference, candidate
        row.note = (
            f"{acc.mismatch} non-finite value(s) the other side lacks (a failure whatever max_failure_fraction "
            f"allows); first at {coords}: reference {reference:.6g}, candidate {candidate:.6g}"
        )
    share = judged_share(acc.elements, acc.both)
    if acc.both and not acc.mismatch and share < JUDGED_FLOOR:
        row.status = "not_judged"  # equal NaN are not agreement: too little here was judged (``judge.coverage``)
        row.note = (
            f"every element ({acc.both}) is non-finite on both sides: nothing could be judged"
            if not finite
            else f"{acc.both} of {acc.elements} elements are non-finite on both sides: only {share:.2%} could be "
            f"judged, under the floor of {JUDGED_FLOOR:.0%}"
        )
    elif acc.both:
        row.warning = f"{acc.both} element(s) non-finite on both sides: not judged ({share:.2%} of the stage judged)"
    return row


def compare_tapsets(
    reference: TapSet, candidate: TapSet, contract: Contract, plan: StagePlan | None = None
) -> list[ComparisonRow]:
    """Every stage either side captured, compared in execution order (integer where ``plan`` says so); free-running
    tokens that part at a near-tie are reported, not failed (``judge.near_tie``)."""
    stage_ids = set(reference.stage_ids()) | set(candidate.stage_ids())
    ordered = plan.ordered(stage_ids) if plan is not None else sorted(stage_ids)
    orders = orders_of(plan)
    rows = [
        compare_stage(
            stage_id,
            reference,
            candidate,
            contract.tolerance(stage_id),
            position,
            orders,
            integer=plan is not None and stage_id in plan and plan[stage_id].integer,
            data=plan is not None and stage_id in plan and plan[stage_id].data,
            derived=derived_bound(plan[stage_id], reference, candidate) if plan and stage_id in plan else None,
        )
        for position, stage_id in enumerate(ordered)
    ]
    settle_near_ties(rows, reference, candidate, contract)
    return rows
