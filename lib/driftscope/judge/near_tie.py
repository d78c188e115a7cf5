"""Free-running tokens that part at a near-tie: reported, not failed (README "The answer, token by token").

The free-running tokens (``text.generate.tokens``) are compared exactly, but a greedy decode follows its own
argmax: where the reference's top-1 leads its runner-up by less than the error the candidate's policy allows
(a *near-tie*, ``judge.forced``), a correct runtime may take the other token, and from there on the two answers
decode different texts. So, for a pair that was teacher-forced (the candidate fed the reference's tokens):

- the tokens first differ at step ``s`` and the forced pass flips there as a **near-tie**, and no forced step
  flips **confidently**: the difference is reported (the row passes with a warning the verdict repeats), the
  margins are judged up to step ``s`` (after it the two decodes read different tokens), and the forced
  comparison carries on over every step;
- any forced flip is **confident** (the reference's margin is more than the policy allows), or the forced pass
  does not flip where the tokens part: the tokens' row fails, as before, saying which.

Without a teacher-forced pass the exact comparison stands.
"""

from __future__ import annotations

import numpy as np

from driftscope.judge.contract import Contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.judge.rows import ComparisonRow
from driftscope.taps.tapset import TapSet

TOKENS, MARGINS = "text.generate.tokens", "text.generate.margins"


def settle_near_ties(rows: list[ComparisonRow], reference: TapSet, candidate: TapSet, contract: Contract) -> None:
    """Re-judge the free-running tokens (and margins) of one pair's ``rows`` in place, by the rule above."""
    by_stage = {row.stage: row for row in rows}
    tokens = by_stage.get(TOKENS)
    if tokens is None or tokens.status != "fail" or FORCED not in reference or FORCED not in candidate:
        return
    a = np.asarray(reference[TOKENS]).reshape(-1)
    b = np.asarray(candidate[TOKENS]).reshape(-1)
    parted = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    forced = forced_pair(reference, candidate, contract)
    if parted is None or forced is None or not forced.get("fed_reference_tokens"):
        return
    flip = next((f for f in forced["flips"] if f["step"] == parted), None)
    confident = [f["step"] for f in forced["flips"] if f["label"] == "confident"]
    if flip is None or confident or flip["label"] != "near-tie":
        why = (
            f"a confident flip at step {confident[0]} (the reference's margin is more than the policy allows)"
            if confident
            else f"the teacher-forced pass does not flip at step {parted}, where the tokens first differ"
        )
        tokens.note = "; ".join(filter(None, [tokens.note, why]))
        return
    said = (
        f"the free-running tokens first differ at step {parted}: a near-tie flip (the reference's margin "
        f"{flip['reference_margin']:.3g} <= the {flip['allowed']:.3g} its policy allows), reported, not failed; "
        "the teacher-forced answer is compared at every step"
    )
    tokens.status, tokens.warning, tokens.tolerance_used = "pass", said, None
    tokens.extra["near_tie"] = {"step": parted, **{k: flip[k] for k in ("reference_margin", "allowed", "label")}}
    margins = by_stage.get(MARGINS)
    if margins is not None and margins.status == "fail":
        _judge_margins_to(margins, reference, candidate, contract, parted)


def _judge_margins_to(row: ComparisonRow, reference: TapSet, candidate: TapSet, contract: Contract, step: int):
    """The margins up to ``step`` (the same tokens read so far), under the stage's tolerance."""
    e = np.asarray(reference[MARGINS], dtype=np.float64).reshape(-1)[: step + 1]
    a = np.asarray(candidate[MARGINS], dtype=np.float64).reshape(-1)[: step + 1]
    tolerance = contract.tolerance(MARGINS)
    bad = ~np.isfinite(a) & np.isfinite(e)
    failures = int(np.count_nonzero((np.abs(a - e) > tolerance.bound(e)) | bad))
    if failures:
        return
    row.status, row.failures, row.failure_fraction, row.tolerance_used = "pass", 0, 0.0, None
    row.note = f"judged up to step {step}: after it the two free-running decodes read different tokens"
