"""Streaming error statistics of one stage, chunk by chunk in reused float64 buffers (bounded memory on big taps)."""

from __future__ import annotations

import threading

import numpy as np

from driftscope.judge.contract import Tolerance

#: Elements read and compared at a time (bounds memory on big taps). The float64 working copies of a
#: chunk live in buffers allocated once per thread and reused: fresh temporaries per chunk were handed
#: back to the kernel and faulted in again every time (1.4 million page faults per 3B comparison).
CHUNK_ELEMENTS = 1 << 16


class Scratch(threading.local):
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


scratch = Scratch()


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Sum of products without BLAS: numpy's threaded BLAS spins a second core after every call, which
    cost as much CPU as the comparison itself and slowed the runtime forward running next to it."""
    return float(np.einsum("i,i->", a, b))


def json_float(value: float) -> float | str:
    """A value for the report: finite floats as they are, the others as ``"nan"``, ``"inf"``, ``"-inf"``."""
    value = float(value)
    return value if np.isfinite(value) else str(value)


class Accumulator:
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
        self.finite = 0  # elements finite on both sides: the metrics are computed over these
        self.mismatch = 0
        self.both = 0
        self.first_nonfinite: tuple[int, float, float] | None = None  # flat index, reference, candidate
        self.max_abs = -1.0
        self.max_excess = 0.0
        self.tolerance_used = 0.0  # largest |a - e| / (atol + rtol * |e|) over every finite element
        #: the failing element furthest over its own bound: flat index, reference, candidate, bound
        self.worst: tuple[int, float, float, float] | None = None
        self.atol_bound = 0  # failures where the reference is so small that atol alone sets the bound
        self.max_index: int | None = None
        self.max_values: tuple[float, float] | None = None
        #: failures under the contract's own bound, where a derived allowance widens it (``judge.bounds``)
        self.contract_failures = 0
        self._extra: np.ndarray | None = None

    def add(self, expected: np.ndarray, actual: np.ndarray, offset: int, extra: np.ndarray | None = None) -> None:
        """Fold in ``expected``/``actual`` (same shape; ``offset``: flat index of their first element); ``extra``:
        an allowance per element added to the contract's bound (a bound derived from the arithmetic)."""
        e, a = expected.reshape(-1), actual.reshape(-1)
        x = None if extra is None else np.asarray(extra, dtype=np.float64).reshape(-1)
        for start in range(0, e.size, CHUNK_ELEMENTS):
            self._extra = None if x is None else x[start : start + CHUNK_ELEMENTS]
            self._add_chunk(e[start : start + CHUNK_ELEMENTS], a[start : start + CHUNK_ELEMENTS], offset + start)
        self._extra = None

    def _add_chunk(self, expected: np.ndarray, actual: np.ndarray, offset: int) -> None:
        n = expected.size
        ef, af = scratch.buffers[0][:n], scratch.buffers[1][:n]
        np.copyto(ef, expected, casting="unsafe")
        np.copyto(af, actual, casting="unsafe")
        norms = _dot(ef, ef), _dot(af, af)
        if np.isfinite(norms).all():
            self._fold(ef, af, norms, offset)
            return
        # a NaN or inf somewhere in this chunk: count them, then fold with them zeroed on both sides
        e, a = ef.copy(), af.copy()  # the raw values, for the worst element
        both = self._count_nonfinite(e, a, offset)
        ef[~both] = 0.0
        af[~both] = 0.0
        self._fold(ef, af, (_dot(ef, ef), _dot(af, af)), offset, e, a, both)

    def _count_nonfinite(self, e: np.ndarray, a: np.ndarray, offset: int) -> np.ndarray:
        """Count each side's non-finite values and the failures they make; the mask of finite pairs.

        A non-finite value fails unless the other side holds the same non-finite value (then it is counted
        in ``both``: not a failure, but nothing was judged there either)."""
        finite_e = np.isfinite(e)
        finite_a = np.isfinite(a)
        self.nonfinite_e += int(e.size - finite_e.sum())
        self.nonfinite_a += int(a.size - finite_a.sum())
        both = finite_e & finite_a
        same_nonfinite = ~both & ((np.isnan(e) & np.isnan(a)) | (e == a))
        mismatch = ~both & ~same_nonfinite
        count = int(mismatch.sum())
        self.failures += count
        self.mismatch += count
        self.both += int(same_nonfinite.sum())
        if count and self.first_nonfinite is None:
            local = int(np.argmax(mismatch))
            self.first_nonfinite = (offset + local, float(e[local]), float(a[local]))
        if count:
            self.max_excess = float("inf")
        return both

    def _fold(
        self, ef: np.ndarray, af: np.ndarray, norms: tuple[float, float], offset: int, e=None, a=None, finite=None
    ) -> None:
        """Sums over finite float64 values (``norms``: their sums of squares; ``e``/``a``: the raw values,
        for the worst element, where they differ from ``ef``/``af``; ``finite``: the mask of pairs finite on
        both sides, where some are not)."""
        n = ef.size
        diff, bound = scratch.buffers[2][:n], scratch.buffers[3][:n]
        self.elements += n
        self.finite += n if finite is None else int(finite.sum())
        self.norm_e += norms[0]
        self.norm_a += norms[1]
        self.dot += _dot(af, ef)
        np.subtract(af, ef, out=diff)
        np.abs(diff, out=diff)
        np.abs(ef, out=bound)
        bound *= self.tol.rtol
        bound += self.tol.atol
        over = scratch.mask[:n]
        if self._extra is not None:
            self.contract_failures += int(np.count_nonzero(np.greater(diff, bound, out=over)))
            bound += self._extra
        failing = int(np.count_nonzero(np.greater(diff, bound, out=over)))
        if failing:
            self.failures += failing
            positions = np.flatnonzero(over)
            with np.errstate(divide="ignore"):
                ratios = diff[positions] / bound[positions]
            top = int(np.argmax(ratios))
            if float(ratios[top]) > self.max_excess or self.worst is None:
                local = int(positions[top])
                raw_e, raw_a = (ef, af) if e is None else (e, a)
                self.max_excess = max(self.max_excess, float(ratios[top]))
                self.worst = (offset + local, float(raw_e[local]), float(raw_a[local]), float(bound[local]))
            # atol decides where atol >= rtol * |e|, i.e. the bound is at most twice atol
            self.atol_bound += int(np.count_nonzero(bound[positions] <= 2.0 * self.tol.atol))
        self._track_used(diff, bound)
        self.sum_sq += _dot(diff, diff)
        self.sum_abs += float(diff.sum())
        if finite is not None:
            diff[~finite] = -1.0  # a non-finite pair is never the worst finite element
        self._track_max(diff, ef if e is None else e, af if a is None else a, offset)

    def _track_used(self, diff: np.ndarray, bound: np.ndarray) -> None:
        """Fold in the largest |difference| / bound of the chunk (0/0, a zero tolerance met exactly, is 0)."""
        if diff.size:
            with np.errstate(divide="ignore", invalid="ignore"):
                used = float(np.fmax.reduce(np.divide(diff, bound, out=bound)))  # the bound is not read again
            if used > self.tolerance_used:  # NaN (every ratio 0/0) never is
                self.tolerance_used = used

    def _track_max(self, diff: np.ndarray, e: np.ndarray, a: np.ndarray, offset: int) -> None:
        """Keep the largest |difference| seen and the raw values at it."""
        if diff.size:
            local = int(np.argmax(diff))
            if diff[local] > self.max_abs:
                self.max_abs = float(diff[local])
                self.max_index = offset + local
                self.max_values = (float(e[local]), float(a[local]))
