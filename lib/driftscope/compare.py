"""Stage-by-stage comparison of two TapSets under a contract: metrics as plain rows.

Metrics live here; orchestration lives in ``investigation``. Rows can be recomputed from saved
TapSets under another contract without re-running any runtime (``compare_tapsets`` again).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

import numpy as np

from .contract import Contract, Tolerance
from .stages import StagePlan, TokenOrder
from .tapset import TapSet

#: Elements read and compared at a time (bounds memory on big taps). The float64 working copies of a
#: chunk live in buffers allocated once per thread and reused: fresh temporaries per chunk were handed
#: back to the kernel and faulted in again every time (1.4 million page faults per 3B comparison).
CHUNK_ELEMENTS = 1 << 16


class _Scratch(threading.local):
    """Per-thread float64 buffers for one chunk: expected, actual, |difference|, tolerance bound."""

    def __init__(self) -> None:
        self.buffers = np.empty((4, CHUNK_ELEMENTS), dtype=np.float64)
        self.mask = np.empty(CHUNK_ELEMENTS, dtype=np.bool_)
        self.raw = [np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint8)]  # file reads: reference, candidate

    def raw_bytes(self, side: int, nbytes: int) -> np.ndarray:
        """A reused read buffer of at least ``nbytes`` for one side of the comparison."""
        if self.raw[side].size < nbytes:
            self.raw[side] = np.empty(max(nbytes, CHUNK_ELEMENTS * 8), dtype=np.uint8)
        return self.raw[side]


_scratch = _Scratch()


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Sum of products without BLAS: numpy's threaded BLAS spins a second core after every call, which
    cost as much CPU as the comparison itself and slowed the runtime forward running next to it."""
    return float(np.einsum("i,i->", a, b))


@dataclass
class ComparisonRow:
    """One stage compared between a reference and a candidate runtime."""

    stage: str
    reference: str
    candidate: str
    position: int
    status: str  # pass | fail | shape_mismatch | missing | skipped
    failures: int = 0
    elements: int = 0
    failure_fraction: float = 0.0
    max_abs: float = 0.0
    rms: float = 0.0
    mean_abs: float = 0.0
    cosine: float = 1.0
    reference_rms: float = 0.0
    relative_rms: float = 0.0
    nonfinite_reference: int = 0
    nonfinite_candidate: int = 0
    max_index: int | None = None
    max_coords: list[int] | None = None
    max_reference_value: float | None = None
    max_candidate_value: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    integer: bool = False
    reference_shape: list[int] | None = None
    candidate_shape: list[int] | None = None
    note: str = ""
    pair: str = ""  # the runtime pair's key in the report ("candidate", or "candidate vs reference")
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "shape_mismatch")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ComparisonRow:
        return cls(**data)


class _Accumulator:
    """Streaming sums for the metrics of one stage."""

    def __init__(self, tolerance: Tolerance):
        self.tol = tolerance
        self.failures = 0
        self.elements = 0
        self.sum_sq = 0.0
        self.sum_abs = 0.0
        self.dot = 0.0
        self.norm_a = 0.0
        self.norm_e = 0.0
        self.nonfinite_a = 0
        self.nonfinite_e = 0
        self.max_abs = -1.0
        self.max_index: int | None = None
        self.max_values: tuple[float, float] | None = None

    def add(self, expected: np.ndarray, actual: np.ndarray, offset: int) -> None:
        """Fold in ``expected``/``actual`` (same shape; ``offset``: flat index of their first element)."""
        e, a = expected.reshape(-1), actual.reshape(-1)
        for start in range(0, e.size, CHUNK_ELEMENTS):
            self._add_chunk(e[start : start + CHUNK_ELEMENTS], a[start : start + CHUNK_ELEMENTS], offset + start)

    def _add_chunk(self, expected: np.ndarray, actual: np.ndarray, offset: int) -> None:
        n = expected.size
        ef, af = _scratch.buffers[0][:n], _scratch.buffers[1][:n]
        np.copyto(ef, expected, casting="unsafe")
        np.copyto(af, actual, casting="unsafe")
        norms = _dot(ef, ef), _dot(af, af)
        if np.isfinite(norms).all():
            self._fold(ef, af, norms, offset)
            return
        # a NaN or inf somewhere in this chunk: count them, then fold with them zeroed on both sides
        e, a = ef.copy(), af.copy()  # the raw values, for the worst element
        both = self._count_nonfinite(e, a)
        ef[~both] = 0.0
        af[~both] = 0.0
        self._fold(ef, af, (_dot(ef, ef), _dot(af, af)), offset, e, a)

    def _count_nonfinite(self, e: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Count each side's non-finite values and the failures they make; the mask of finite pairs."""
        finite_e = np.isfinite(e)
        finite_a = np.isfinite(a)
        self.nonfinite_e += int(e.size - finite_e.sum())
        self.nonfinite_a += int(a.size - finite_a.sum())
        both = finite_e & finite_a
        # A non-finite value on either side fails unless both sides hold the same non-finite value.
        same_nonfinite = ~both & ((np.isnan(e) & np.isnan(a)) | (e == a))
        self.failures += int((~both & ~same_nonfinite).sum())
        return both

    def _fold(self, ef: np.ndarray, af: np.ndarray, norms: tuple[float, float], offset: int, e=None, a=None) -> None:
        """Sums over finite float64 values (``norms``: their sums of squares; ``e``/``a``: the raw values,
        for the worst element, where they differ from ``ef``/``af``)."""
        n = ef.size
        diff, bound = _scratch.buffers[2][:n], _scratch.buffers[3][:n]
        self.elements += n
        self.norm_e += norms[0]
        self.norm_a += norms[1]
        self.dot += _dot(af, ef)
        np.subtract(af, ef, out=diff)
        np.abs(diff, out=diff)
        np.abs(ef, out=bound)
        bound *= self.tol.rtol
        bound += self.tol.atol
        self.failures += int(np.count_nonzero(np.greater(diff, bound, out=_scratch.mask[:n])))
        self.sum_sq += _dot(diff, diff)
        self.sum_abs += float(diff.sum())
        self._track_max(diff, ef if e is None else e, af if a is None else a, offset)

    def _track_max(self, diff: np.ndarray, e: np.ndarray, a: np.ndarray, offset: int) -> None:
        """Keep the largest |difference| seen and the raw values at it."""
        if diff.size:
            local = int(np.argmax(diff))
            if diff[local] > self.max_abs:
                self.max_abs = float(diff[local])
                self.max_index = offset + local
                self.max_values = (float(e[local]), float(a[local]))


def _active_slice(declaration: dict, length: int) -> list[tuple[int, int]]:
    ranges = declaration.get("active_rows")
    if not ranges:
        return [(0, length)]
    return [(int(start), int(stop)) for start, stop in ranges]


def compare_stage(
    stage_id: str,
    reference: TapSet,
    candidate: TapSet,
    tolerance: Tolerance,
    position: int,
    order: TokenOrder | None = None,
) -> ComparisonRow:
    """Compare one stage of two TapSets; never raises for data problems (they go in the row).

    ``order``: how the stage's token order goes back to raster order, when the two sides' orders differ."""
    row = ComparisonRow(
        stage_id, reference.label, candidate.label, position, "pass", atol=tolerance.atol, rtol=tolerance.rtol
    )
    if tolerance.skip:
        row.status, row.note = "skipped", "skipped by the contract"
        return row
    if stage_id not in reference or stage_id not in candidate:
        side = "reference" if stage_id not in reference else "candidate"
        row.status, row.note = "missing", f"not captured by the {side}"
        return row
    declaration = reference.declaration(stage_id)
    cand_declaration = candidate.declaration(stage_id)
    row.integer = bool(declaration.get("integer") or cand_declaration.get("integer"))
    ref_shape, cand_shape = reference.shape(stage_id), candidate.shape(stage_id)
    row.reference_shape, row.candidate_shape = list(ref_shape), list(cand_shape)
    if ref_shape != cand_shape:
        row.status = "shape_mismatch"
        row.note = f"shapes differ: reference {list(ref_shape)} vs candidate {list(cand_shape)}"
        row.failures = row.elements = int(max(np.prod(ref_shape), np.prod(cand_shape)))
        row.failure_fraction = 1.0
        return row
    if row.integer:
        return _compare_integer(row, reference[stage_id], candidate[stage_id])
    if stage_id.startswith("text.logits"):
        row.extra.update(logit_agreement(np.asarray(reference[stage_id]), np.asarray(candidate[stage_id])))

    accumulator = _Accumulator(tolerance)
    reorder = _needs_reorder(order, reference, candidate)
    if reorder is not None:
        ref_index, cand_index = reorder
        unit = declaration.get("token_unit")
        expected = order.to_raster(reference[stage_id], ref_index, unit)
        actual = order.to_raster(candidate[stage_id], cand_index, unit)
        row.note = (
            f"{declaration.get('token_order')} orders differ: both sides restored to raster order with their own "
            f"{order.index}"
        )
        for start, stop in _active_slice(declaration, ref_shape[0]):
            inner = int(np.prod(ref_shape[1:]))
            accumulator.add(expected[start:stop], actual[start:stop], start * inner)
    else:
        inner = int(np.prod(ref_shape[1:])) if len(ref_shape) > 1 else 1
        step = max(1, CHUNK_ELEMENTS // max(inner, 1))
        if len(ref_shape) == 0:
            accumulator.add(reference[stage_id], candidate[stage_id], 0)
        else:
            for start, stop in _active_slice(declaration, ref_shape[0]):
                for chunk in range(start, stop, step):
                    end = min(stop, chunk + step)
                    size = (end - chunk) * inner * 8  # enough for any stored dtype
                    expected = reference.rows_into(stage_id, chunk, end, _scratch.raw_bytes(0, size))
                    actual = candidate.rows_into(stage_id, chunk, end, _scratch.raw_bytes(1, size))
                    accumulator.add(expected, actual, chunk * inner)
    return _finish(row, accumulator, ref_shape, tolerance)


def top2_margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit (a near-tie is a small margin)."""
    top = np.sort(np.asarray(logits, dtype=np.float64))[-2:]
    return float(top[1] - top[0])


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


def _needs_reorder(order: TokenOrder | None, reference: TapSet, candidate: TapSet):
    if order is None:
        return None
    key = order.index
    if key not in reference or key not in candidate:
        return None
    ref_index, cand_index = reference[key], candidate[key]
    if ref_index.shape == cand_index.shape and np.array_equal(ref_index, cand_index):
        return None
    if sorted(ref_index.tolist()) != list(range(len(ref_index))) or sorted(cand_index.tolist()) != list(
        range(len(cand_index))
    ):
        return None
    return ref_index, cand_index


def _compare_integer(row: ComparisonRow, expected: np.ndarray, actual: np.ndarray) -> ComparisonRow:
    diff = expected.astype(np.int64) != actual.astype(np.int64)
    row.elements = int(expected.size)
    row.failures = int(diff.sum())
    row.failure_fraction = row.failures / row.elements if row.elements else 0.0
    delta = np.abs(expected.astype(np.int64) - actual.astype(np.int64)).ravel()
    row.max_abs = float(delta.max()) if delta.size else 0.0
    row.rms = float(np.sqrt(np.mean(delta.astype(np.float64) ** 2))) if delta.size else 0.0
    row.mean_abs = float(delta.mean()) if delta.size else 0.0
    row.cosine = 1.0 if row.failures == 0 else float("nan")
    if row.failures:
        flat = int(np.flatnonzero(diff.ravel())[0])
        row.max_index = flat
        row.max_coords = [int(c) for c in np.unravel_index(flat, expected.shape)]
        row.max_reference_value = float(expected.ravel()[flat])
        row.max_candidate_value = float(actual.ravel()[flat])
        row.status = "fail"
        row.note = "integer stage must be equal"
    return row


def _finish(row: ComparisonRow, acc: _Accumulator, shape: tuple[int, ...], tol: Tolerance) -> ComparisonRow:
    row.elements = acc.elements
    row.failures = acc.failures
    row.failure_fraction = acc.failures / acc.elements if acc.elements else 0.0
    row.max_abs = max(acc.max_abs, 0.0)
    row.rms = float(np.sqrt(acc.sum_sq / acc.elements)) if acc.elements else 0.0
    row.mean_abs = acc.sum_abs / acc.elements if acc.elements else 0.0
    row.reference_rms = float(np.sqrt(acc.norm_e / acc.elements)) if acc.elements else 0.0
    row.relative_rms = row.rms / row.reference_rms if row.reference_rms > 0 else (0.0 if row.rms == 0 else float("inf"))
    denominator = np.sqrt(acc.norm_a) * np.sqrt(acc.norm_e)
    if denominator > 0:
        row.cosine = float(acc.dot / denominator)
    else:
        row.cosine = 1.0 if acc.norm_a == acc.norm_e else 0.0
    row.nonfinite_reference, row.nonfinite_candidate = acc.nonfinite_e, acc.nonfinite_a
    if acc.max_index is not None and shape:
        row.max_index = acc.max_index
        row.max_coords = [int(c) for c in np.unravel_index(acc.max_index, shape)]
        row.max_reference_value, row.max_candidate_value = acc.max_values
    row.status = "fail" if row.failure_fraction > tol.max_failure_fraction else "pass"
    if row.status == "pass" and acc.failures and tol.max_failure_fraction:
        row.note = f"{acc.failures} failures within the allowed fraction {tol.max_failure_fraction}"
    return row


def compare_tapsets(
    reference: TapSet, candidate: TapSet, contract: Contract, plan: StagePlan | None = None
) -> list[ComparisonRow]:
    """Every stage either side captured, compared in execution order."""
    stage_ids = set(reference.stage_ids()) | set(candidate.stage_ids())
    ordered = plan.ordered(stage_ids) if plan is not None else sorted(stage_ids)
    return [
        compare_stage(
            stage_id,
            reference,
            candidate,
            contract.tolerance(stage_id),
            position,
            TokenOrder.of(plan, reference.declaration(stage_id).get("token_order") if stage_id in reference else None),
        )
        for position, stage_id in enumerate(ordered)
    ]


def first_divergence(rows: list[ComparisonRow]) -> ComparisonRow | None:
    """The first row, in execution order, that fails the contract."""
    return next((row for row in rows if row.failed), None)


def growth_stages(
    rows: list[ComparisonRow], factor: float = 10.0, floor: float = 1e-4, side: set[str] | frozenset[str] = frozenset()
) -> list[dict]:
    """Stages whose relative RMS error is ``factor`` times the previous compared float stage's.

    Only stages whose ``max_abs`` exceeds ``floor`` count, so float32 round-off does not show up;
    ``side`` stages (inputs such as RoPE tables, off the activation path) are skipped.
    """
    found = []
    previous: ComparisonRow | None = None
    for row in rows:
        if row.integer or row.status not in ("pass", "fail") or row.stage in side:
            continue
        if previous is not None and row.max_abs > floor and previous.relative_rms > 0:
            ratio = row.relative_rms / previous.relative_rms
            if ratio >= factor:
                found.append(
                    {
                        "stage": row.stage,
                        "previous": previous.stage,
                        "factor": ratio,
                        "relative_rms": row.relative_rms,
                        "max_abs": row.max_abs,
                    }
                )
        elif previous is not None and row.max_abs > floor and previous.relative_rms == 0 and row.relative_rms > 0:
            found.append(
                {
                    "stage": row.stage,
                    "previous": previous.stage,
                    "factor": float("inf"),
                    "relative_rms": row.relative_rms,
                    "max_abs": row.max_abs,
                }
            )
        previous = row
    return found


def rows_frame(rows: list[ComparisonRow]):
    """The rows as a pandas DataFrame (one row per stage and runtime pair)."""
    import pandas as pd

    columns = [
        "stage",
        "pair",
        "reference",
        "candidate",
        "status",
        "failures",
        "elements",
        "max_abs",
        "rms",
        "mean_abs",
        "relative_rms",
        "cosine",
        "nonfinite_reference",
        "nonfinite_candidate",
        "max_coords",
        "max_reference_value",
        "max_candidate_value",
        "note",
    ]
    frame = pd.DataFrame([{key: getattr(row, key) for key in columns} for row in rows], columns=columns)
    frame["pair"] = [row.pair or row.candidate for row in rows]
    return frame
