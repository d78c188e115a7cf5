"""Three-way with a half-precision reference: each candidate's teacher-forced logit error against the f32
reference, next to a half-precision peer's own error against it (e.g. ``mlx:bf16`` or ``mlx:f16``, the peer of
``relative: {peer: ...}`` or else the run's first runtime computing in half precision).

Per candidate, over every forced step and token: the ratio of the two errors' RMS, and the overlap coefficient
of their magnitude distributions (histograms of ``log10 |c - r|``, a tenth of a decade per bin, zeros in a bin
of their own: 1 when the two spread alike, 0 when they do not meet). The candidate's error is **what half
precision costs** when the ratio is at most the contract's ``peer_factor`` for ``text.forced.logits`` (plus
``peer_floor`` over the peer's RMS), and **something else** when it is above.

The KV cache the same way (``text.cache.{prefill,forced}.{keys,values}``, every runtime fed the same tokens, so
the same positions): per stage and decoder layer, the candidate's error RMS against the reference next to the
peer's, under that stage's ``peer_factor``/``peer_floor``. The cache is what half precision costs when every
layer of every stage is within its bound; otherwise the lowest layer beyond it is where something else starts.
"""

from __future__ import annotations

import numpy as np

from driftscope.judge.cache import KINDS, PHASES, cache_stage
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

    def merge(self, other: _Errors) -> None:
        self.squares += other.squares
        self.count += other.count
        self.zeros += other.zeros
        self.histogram += other.histogram

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
                f"{label}'s forced-logit error is within what {out['peer_dtype']} costs ({peer}: ratio "
                + (f"{ratio:.3g}" if ratio is not None else "n/a")
                + f", overlap {overlap:.2f})"
                if explained
                else f"{label}'s forced-logit error is something else: "
                + (f"{ratio:.3g}x" if ratio is not None else "above")
                + f" {peer}'s (overlap {overlap:.2f})"
            ),
        }
        cache = cache_three_way(ref, tapset, tapsets[peer], contract, peer)
        if cache is not None:
            out["candidates"][label]["cache"] = cache
    return out


def _verdict_entry(own: _Errors, half: _Errors, factor: float, floor: float) -> dict:
    bound = factor * half.rms + floor
    return {
        "candidate_rmse": own.rms,
        "peer_rmse": half.rms,
        "ratio": own.rms / half.rms if half.rms > 0 else None,
        "bound": bound,
        "within": own.rms <= bound,
    }


def cache_three_way(
    reference: TapSet, candidate: TapSet, peer: TapSet, contract: Contract, peer_label: str = "the peer"
) -> dict | None:
    """The candidate's KV-cache error next to the peer's, per cache stage and decoder layer (None when the three
    do not share a cache stage of one shape)."""
    stages = {}
    own_all, half_all = _Errors(), _Errors()
    beyond = None  # (layer, stage): the lowest layer, then the first stage, whose error is past the peer's bound
    for stage_id in (cache_stage(phase, kind) for phase in PHASES for kind in KINDS):
        if not all(stage_id in t for t in (reference, candidate, peer)):
            continue
        shape = tuple(reference.shape(stage_id))
        if len(shape) != 4 or tuple(candidate.shape(stage_id)) != shape or tuple(peer.shape(stage_id)) != shape:
            stages[stage_id] = {"status": "shape_mismatch"}
            continue
        tolerance = contract.tolerance(stage_id)
        own_stage, half_stage, layers = _Errors(), _Errors(), []
        for layer in range(shape[0]):  # a layer at a time, read from disk
            r = np.asarray(reference.rows(stage_id, layer, layer + 1)[0], dtype=np.float64)
            own, half = _Errors(), _Errors()
            for errors, tapset in ((own, candidate), (half, peer)):
                error = (np.asarray(tapset.rows(stage_id, layer, layer + 1)[0], dtype=np.float64) - r).reshape(-1)
                errors.add(error)
            for total, part in ((own_stage, own), (half_stage, half), (own_all, own), (half_all, half)):
                total.merge(part)
            entry = {"layer": layer, **_verdict_entry(own, half, tolerance.peer_factor, tolerance.peer_floor)}
            layers.append(entry)
            if not entry["within"] and (beyond is None or layer < beyond[0]):
                beyond = (layer, stage_id)
        stages[stage_id] = {
            **_verdict_entry(own_stage, half_stage, tolerance.peer_factor, tolerance.peer_floor),
            "factor": tolerance.peer_factor,
            "floor": tolerance.peer_floor,
            "layers": layers,
        }
    if not stages or own_all.count == 0:
        return None
    overlap = float(np.minimum(own_all.distribution(), half_all.distribution()).sum())
    ratio = own_all.rms / half_all.rms if half_all.rms > 0 else None
    said = f"ratio {ratio:.3g}" if ratio is not None else "ratio n/a"
    dtype = activation_dtype(peer)
    return {
        "candidate_rmse": own_all.rms,
        "peer_rmse": half_all.rms,
        "ratio": ratio,
        "overlap": overlap,
        "verdict": "half-precision" if beyond is None else "something else",
        "first_layer": None if beyond is None else beyond[0],
        "first_stage": None if beyond is None else beyond[1],
        "rule": "what half precision costs when every layer of every cache stage has "
        "RMS(c - r) <= peer_factor * RMS(peer - r) + peer_floor (the stage's contract key)",
        "text": (
            f"its KV cache's error is within what {dtype} costs ({said}, overlap {overlap:.2f})"
            if beyond is None
            else f"its KV cache's error is something else from layer {beyond[0]} ({beyond[1].rsplit('.', 1)[1]}: "
            f"{_times(stages[beyond[1]]['layers'][beyond[0]]['ratio'])} {peer_label}'s)"
        ),
        "stages": stages,
    }


def _times(ratio: float | None) -> str:
    return "above" if ratio is None else f"{ratio:.3g}x"
