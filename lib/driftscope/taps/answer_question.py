"""Whether a candidate's answer is in question, decided after its free-running decode.

Teacher forcing (``text.forced.*``: the per-step logits fed the reference's tokens, from which the judge draws the
top-k maps and labels flips) and the KV-cache taps (``text.cache.*``) are the answer's evidence. Where the tokens
agree, the forced rows are the greedy rows already computed, so what they cost is holding and writing them and the
cache; where the tokens differ, the forced pass also feeds the reference's tokens from the first differing step
on (a decode step each). A candidate fed the reference's answer (``TextInputs.reference_answer``) takes them where
its answer is in question, by the rule ``TextInputs.evidence_rule`` carries (the parameter file's
``text.forced``, the contract's tolerances):

- **tokens**: its greedy tokens differ from the reference's (at the first step that differs);
- **near tie**: at a step whose tokens agree so far, its own or the reference's top-1 minus top-2 margin is at most
  the band its policy allows (``core.numeric.margin_band`` under ``text.forced.top5``: ``judge.forced``'s rule for
  a near-tie flip, so a flip a precision explains could hide there);
- **top-5**: its logits at the reference's top-5 tokens break ``text.forced.top5`` at a step (the top-5 map fails);
- **margin**: its margin breaks ``text.generate.margins`` against the reference's at a step (that row fails);
- **always**: the parameter file asks (``text: {forced: always}``).

Otherwise none is taken: the answer is the reference's token for token, every margin clear of the band and of its
tolerance. The capture declares the stages absent with why (the sidecar's ``declared_absent``, which the coverage
rule excuses) and records the decision (``answer_evidence``) either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from driftscope.core.numeric import margin_band

#: the reference's best tokens per step a candidate's decode is given (the top-5 map's)
TOP = 5
EVIDENCE = ("teacher_forcing", "topk_maps", "kv_cache")
MODES = ("auto", "always")


def reference_answer(tokens, margins, rows) -> dict[str, np.ndarray]:
    """What a candidate's decode weighs its answer against: the reference's greedy ``tokens`` and ``margins`` and,
    from its logits ``rows`` (``[steps, vocab]``, one at a time), each step's :data:`TOP` tokens and logits."""
    tops, values = [], []
    for row in rows:
        row = np.asarray(row, dtype=np.float64).reshape(-1)
        order = np.argsort(-row, kind="stable")[: min(TOP, row.size)]
        tops.append(order)
        values.append(row[order])
    return {
        "tokens": np.asarray(tokens, dtype=np.int64).reshape(-1),
        "margins": np.asarray(margins, dtype=np.float64).reshape(-1),
        "top_tokens": np.asarray(tops, dtype=np.int64),
        "top_logits": np.asarray(values, dtype=np.float64),
    }


def evidence_rule(mode: str, top5: tuple, margins: tuple) -> dict:
    """The plain record :class:`AnswerQuestion` reads: ``mode`` and two ``(atol, rtol, max_failure_fraction)``."""
    return {"mode": mode, "top5": [float(v) for v in top5], "margins": [float(v) for v in margins]}


@dataclass
class AnswerQuestion:
    """The rule and the reference's answer one candidate's decode is weighed by (see the module)."""

    mode: str
    reference: dict[str, np.ndarray]
    top5: tuple[float, float, float]
    margins: tuple[float, float, float]
    dtype: str = "float32"  # the candidate policy's activation dtype (its unit of least precision)
    reasons: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, text, dtype: str = "float32") -> AnswerQuestion | None:
        """The question a capture of ``text`` (``TextInputs``) answers, or None where it is not fed a reference
        answer (the reference itself; a capture fed tokens for another purpose takes every piece of evidence)."""
        rule = getattr(text, "evidence_rule", None)
        reference = getattr(text, "reference_answer", None)
        if not rule or not reference or getattr(text, "forced", None) is None:
            return None
        return cls(str(rule["mode"]), dict(reference), tuple(rule["top5"]), tuple(rule["margins"]), dtype)

    @property
    def always(self) -> bool:
        return self.mode == "always"

    def weigh(self, tokens: list[int], margins: list[float], rows: list[np.ndarray]) -> list[str]:
        """Why the answer is in question (empty: it is not): ``tokens`` and ``margins`` of the free-running decode,
        ``rows`` its logits at the steps whose tokens so far are the reference's (row ``i`` after ``tokens[:i]``)."""
        reasons = []
        if self.always:
            self.reasons = ["the parameter file asks for it (text: {forced: always})"]
            return self.reasons
        ours = np.asarray(tokens, dtype=np.int64)
        theirs = self.reference["tokens"]
        parted = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if parted is not None or ours.size != theirs.size:
            step = parted if parted is not None else min(ours.size, theirs.size)
            reasons.append(f"tokens: the greedy tokens differ from the reference's from step {step}")
        for index, row in enumerate(rows):
            found = self._step(index, np.asarray(row, dtype=np.float64).reshape(-1), float(margins[index]))
            if found:
                reasons.append(found)
                break  # the first step that puts the answer in question
        self.reasons = reasons
        return reasons

    def _step(self, index: int, row: np.ndarray, margin: float) -> str | None:
        if index >= self.reference["tokens"].size:
            return None
        top, values = self.reference["top_tokens"][index], self.reference["top_logits"][index]
        atol, rtol, fraction = self.top5
        ours = np.sort(row)[-2:] if row.size > 1 else np.repeat(row, 2)
        band = margin_band(ours[1], ours[0], atol, rtol, self.dtype)
        if margin <= band:
            return f"near tie: step {index}'s margin {margin:.3g} is within the {band:.3g} its policy allows"
        theirs = float(self.reference["margins"][index])
        band = margin_band(values[0], values[1] if values.size > 1 else values[0], atol, rtol, self.dtype)
        if theirs <= band:
            return f"near tie: the reference's margin at step {index}, {theirs:.3g}, is within the {band:.3g} allowed"
        candidate = row[top]
        bad = np.isfinite(values) & ~np.isfinite(candidate)
        error = np.where(bad, 0.0, np.abs(candidate - values))
        failures = int(np.count_nonzero((error > atol + rtol * np.abs(values)) | bad))
        if bad.any() or failures > math.floor(fraction * values.size):
            return f"top-5: step {index}'s logits at the reference's top-5 tokens break text.forced.top5 ({failures})"
        atol, rtol, _ = self.margins
        if not math.isfinite(margin) or abs(margin - theirs) > atol + rtol * abs(theirs):
            said = f"{margin:.4g} breaks its tolerance against the reference's {theirs:.4g}"
            return f"margin: step {index}'s margin {said}"
        return None

    def record(self, taken: bool, note: str | None = None) -> dict:
        """What the report says: which evidence was taken and why."""
        said = {"mode": self.mode, "in_question": bool(self.reasons), "why": list(self.reasons)}
        said.update({name: taken for name in EVIDENCE})
        if note:
            said["note"] = note
        return said

    def absent_because(self) -> str:
        """Why the evidence stages are absent: the sidecar's ``declared_absent`` entry for each."""
        return (
            "not taken: the answer is not in question (the greedy tokens are the reference's, every step's margin is "
            "clear of the band its policy allows and of its tolerance, its top-5 logits within text.forced.top5)"
        )
