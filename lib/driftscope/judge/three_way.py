"""Three-way with a half-precision reference: each candidate's teacher-forced logit error against the f32
reference, next to a half-precision peer's own error against it (e.g. ``mlx:bf16`` or ``mlx:f16``, the peer of
``relative: {peer: ...}`` or else the run's first runtime computing in half precision).

Per candidate, over every forced step and token: the ratio of the two errors' RMS, and the overlap coefficient
of their magnitude distributions (histograms of ``log10 |c - r|``, a tenth of a decade per bin, zeros in a bin
of their own: 1 when the two spread alike, 0 when they do not meet). The candidate's error is **what half
precision costs** when the ratio is at most the contract's ``peer_factor`` for ``text.forced.logits`` (plus
``peer_floor`` over the peer's RMS), and **something else** when it is above.
"""

from __future__ import annotations

import numpy as np

from driftscope.judge.contract import Contract
from driftscope.judge.forced import FORCED, activation_dtype
from driftscope.taps.tapset import TapSet

HALF = ("bfloat16", "float16")
_EDGES = np.arange(-12.0, 6.05, 0.1)  # log10 |error| bins; below the first edge goes to the first bin


def half_peer(tapsets: dict[str, TapSet], reference: str, named: str | None = None) -> str | None:
    """The half-precision peer: ``named`` when it ran with forced logits, else the first runtime computing in
    bfloat16 or float16 that did (None: there is none)."""
    usable = [label for label, t in tapsets.items() if label != reference and FORCED in t]
    if named in usable:
        return named
    return next((label for label in usable if activation_dtype(tapsets[label]) in HALF), None)


class _Errors:
    """A running sum of squares and a histogram of one runtime's forced errors."""

    def __init__(self):
        self.squares, self.count, self.zeros = 0.0, 0, 0
        self.histogram = np.zeros(len(_EDGES) + 1, dtype=np.int64)

    def add(self, error: np.ndarray) -> None:
        error = error[np.isfinite(error)]
        self.squares += float(np.sum(error * error))
        self.count += int(error.size)
        magnitude = np.abs(error)
        self.zeros += int(np.count_nonzero(magnitude == 0))
        self.histogram += np.bincount(
            np.searchsorted(_EDGES, np.log10(magnitude[magnitude > 0])), minlength=len(self.histogram)
        )

    @property
    def rms(self) -> float:
        return float(np.sqrt(self.squares / self.count)) if self.count else 0.0

    def distribution(self) -> np.ndarray:
        counts = np.concatenate([[self.zeros], self.histogram]).astype(np.float64)
        return counts / max(counts.sum(), 1.0)


def three_way(tapsets: dict[str, TapSet], reference: str, peer: str, contract: Contract) -> dict:
    """Per candidate: its forced-logit error RMS, the peer's, their ratio, the overlap coefficient, the verdict."""
    ref = tapsets[reference]
    tolerance = contract.tolerance(FORCED)
    out: dict = {
        "reference": reference,
        "peer": peer,
        "peer_dtype": activation_dtype(tapsets[peer]),
        "factor": tolerance.peer_factor,
        "floor": tolerance.peer_floor,
        "rule": "what half precision costs when RMS(c - r) <= peer_factor * RMS(peer - r) + peer_floor",
        "candidates": {},
    }
    shape = tuple(ref.shape(FORCED)) if FORCED in ref else None
    for label, tapset in tapsets.items():
        if label in (reference, peer) or FORCED not in tapset or shape is None:
            continue
        if tuple(tapset.shape(FORCED)) != shape or tuple(tapsets[peer].shape(FORCED)) != shape:
            out["candidates"][label] = {"status": "shape_mismatch"}
            continue
        own, half = _Errors(), _Errors()
        for index in range(shape[0]):  # a row at a time: never [steps, vocab] of three runtimes at once
            r = np.asarray(ref.rows(FORCED, index, index + 1)[0], dtype=np.float64)
            own.add(np.asarray(tapset.rows(FORCED, index, index + 1)[0], dtype=np.float64) - r)
            half.add(np.asarray(tapsets[peer].rows(FORCED, index, index + 1)[0], dtype=np.float64) - r)
        bound = tolerance.peer_factor * half.rms + tolerance.peer_floor
        ratio = own.rms / half.rms if half.rms > 0 else None
        overlap = float(np.minimum(own.distribution(), half.distribution()).sum())
        explained = own.rms <= bound
        out["candidates"][label] = {
            "candidate_rmse": own.rms,
            "peer_rmse": half.rms,
            "ratio": ratio,
            "overlap": overlap,
            "bound": bound,
            "verdict": "half-precision" if explained else "something else",
            "text": (
                f"{label}'s forced-logit error is what {out['peer_dtype']} costs ({peer}: ratio "
                + (f"{ratio:.3g}" if ratio is not None else "n/a")
                + f", overlap {overlap:.2f})"
                if explained
                else f"{label}'s forced-logit error is something else: "
                + (f"{ratio:.3g}x" if ratio is not None else "above")
                + f" {peer}'s (overlap {overlap:.2f})"
            ),
        }
    return out
