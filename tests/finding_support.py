"""What a run's patch trial (``report.json["patch_trials"]``) must say, computed here from the TapSets with numpy."""

from __future__ import annotations

import numpy as np


def shares_from_the_taps(report, key: str, stage: str) -> tuple[float, float]:
    """The run's candidate's and the patched capture's worst share of tolerance at ``stage``: ``max |a - e| /
    (atol + rtol |e|)`` against the reference's tap, from the TapSets (the patched capture's path is the trial's)."""
    from driftscope.taps.tapset import TapSet

    trial = report.data["patch_trials"][key]
    row = next(r for r in report.rows if r.stage == stage and (r.pair or r.candidate) == key)
    reference, candidate = report.pair_tapsets(key)
    patched = TapSet(report.directory / trial["tapset"].removesuffix(".safetensors"))
    expected = np.asarray(reference[stage], dtype=np.float64)
    bound = row.atol + row.rtol * np.abs(expected)
    return tuple(
        float(np.max(np.abs(np.asarray(t[stage], dtype=np.float64) - expected) / bound)) for t in (candidate, patched)
    )
