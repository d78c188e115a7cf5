"""Comparison rows: one stage of one runtime pair as a plain struct, and what is read off a list of them
(the first divergence, where the error grows, a DataFrame). Computed by ``compare``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields


@dataclass
class ComparisonRow:
    """One stage compared between a reference and a candidate runtime."""

    stage: str
    reference: str
    candidate: str
    position: int
    status: str  # pass | fail | shape_mismatch | layout_mismatch | missing | skipped | not_judged
    failures: int = 0
    elements: int = 0
    failure_fraction: float = 0.0
    max_abs: float = 0.0
    #: largest |a - e| / (atol + rtol * |e|) among the elements over tolerance: how far the worst failing
    #: element is past its bound (0 when none fails; inf, stored as null, for a non-finite failure)
    max_excess: float | None = 0.0
    #: largest |a - e| / (atol + rtol * |e|) over every element compared: the share of its own tolerance the
    #: stage's worst element uses (above 1: it fails); None where nothing was compared (missing, skipped,
    #: shapes that differ) or in reports written before it was recorded
    tolerance_used: float | None = None
    rms: float = 0.0
    mean_abs: float = 0.0
    cosine: float = 1.0
    reference_rms: float = 0.0
    relative_rms: float = 0.0
    nonfinite_reference: int = 0
    nonfinite_candidate: int = 0
    nonfinite_mismatch: int = 0  # elements non-finite on one side where the other side differs (always a failure)
    nonfinite_both: int = 0  # elements with the same non-finite value on both sides (a warning: not judged)
    first_nonfinite: dict | None = None  # {index, coords, reference, candidate} of the first such element
    #: the failing element furthest over its own bound atol + rtol*|e|: {index, coords, reference, candidate,
    #: tolerance, excess} (None when nothing fails); where the stage fails this is the element to look at
    worst_failing: dict | None = None
    atol_bound_failures: int = 0  # failures where |reference| <= atol/rtol, so atol alone set the bound
    max_index: int | None = None
    max_coords: list[int] | None = None
    max_reference_value: float | None = None
    max_candidate_value: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    #: which bound judged the stage: ``contract`` (atol + rtol * |e| decided every element), or a bound derived
    #: from the arithmetic that let some elements pass the contract alone fails (``judge.bounds``; e.g.
    #: ``rotary round-off``), with its rule and counts in ``bound_detail``
    bound: str = "contract"
    bound_detail: dict | None = None
    integer: bool = False
    reference_shape: list[int] | None = None
    candidate_shape: list[int] | None = None
    note: str = ""
    warning: str = ""  # something the verdict should mention although the row passes (e.g. NaN on both sides)
    pair: str = ""  # the runtime pair's key in the report ("candidate", or "candidate vs reference")
    extra: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "shape_mismatch", "layout_mismatch")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ComparisonRow:
        """A row read back from JSON (where non-finite metrics were written as null); fields a newer
        driftscope added are ignored, so an older one still reads its rows."""
        known = {f.name for f in fields(cls)}
        data = {key: value for key, value in data.items() if key in known}
        for key in _FLOAT_METRICS:
            if key in data and data[key] is None:
                data[key] = float("nan")
        return cls(**data)


_FLOAT_METRICS = ("failure_fraction", "max_abs", "rms", "mean_abs", "cosine", "reference_rms", "relative_rms")


def share_of_tolerance(row: ComparisonRow) -> float:
    """``|a - e| / (atol + rtol * |e|)`` at the stage's worst element (above 1: an element fails).

    Reports written before this was recorded give the value at the largest difference (a lower bound), or
    the worst failing element's excess where the stage fails; a non-finite failure is infinite."""
    used = getattr(row, "tolerance_used", None)
    if used is not None and not (isinstance(used, float) and math.isnan(used)):
        return float(used)
    if row.failed and (row.max_excess is None or row.nonfinite_mismatch):
        return math.inf
    bound = row.atol + row.rtol * abs(row.max_reference_value or 0.0)
    at_max = row.max_abs / bound if bound > 0 else (0.0 if row.max_abs == 0 else math.inf)
    return max(at_max, float(row.max_excess or 0.0))


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
        "nonfinite_mismatch",
        "nonfinite_both",
        "max_coords",
        "max_reference_value",
        "max_candidate_value",
        "bound",
        "note",
        "warning",
    ]
    frame = pd.DataFrame([{key: getattr(row, key) for key in columns} for row in rows], columns=columns)
    frame["pair"] = [row.pair or row.candidate for row in rows]
    return frame
