"""Notebook 06's teacher-forced answer: where each candidate's answer first diverges, the top-k tolerance maps,
the reference margins against the error band with each flip's label, and the expected words each drops."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from driftscope.judge.contract import FORCED_KEYS
from driftscope.run.report import Report

from .notebook import describe

KEYS = list(FORCED_KEYS.values())


def escaped(text: str) -> str:
    """``text`` with every character a page would not show (the replacement character random-weight tokens
    decode to, control characters) written as its escape, e.g. ``\\ufffd``."""
    return "".join(
        ch if ch.isprintable() and ch != "\ufffd" else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def _forced_pairs(report: Report) -> list[dict]:
    return [pair for pair in (report.data.get("answer") or {}).get("pairs", []) if pair.get("forced")]


def _flips(forced: dict) -> str:
    return ", ".join(f"step {f['step']}: {f['label']}" for f in forced.get("flips", [])) or "none"


def forced_frame(report: Report):
    """One row per pair: whether the candidate was fed the reference's tokens, the step at which its answer
    first diverges teacher-forced (and under which top-k keys), the free-running first differing token, and
    each forced flip with its label."""
    import pandas as pd

    records = []
    for pair in _forced_pairs(report):
        forced = pair["forced"]
        first = forced.get("first_divergence")
        by = ", ".join(k.rsplit(".", 1)[1] for k in forced.get("first_divergence_by") or [])
        records.append(
            {
                "pair": f"{pair['candidate']} vs {pair['reference']}",
                "fed the reference's tokens": {True: "yes", False: "NO"}.get(
                    forced.get("fed_reference_tokens"), "not said"
                ),
                "steps": forced.get("steps_compared"),
                "first divergence (teacher-forced)": "none" if first is None else f"step {first} ({by})",
                "first differing token (free-running)": (
                    "none" if pair.get("first_difference") is None else f"step {pair['first_difference']}"
                ),
                "flips (teacher-forced)": _flips(forced),
                "confident flips": forced.get("confident_flips", 0),
            }
        )
    return pd.DataFrame(records)


def topk_map(report: Report) -> Figure:
    """Per pair, the share of its tolerance the worst of the reference's top-k tokens uses at each step (k = 5,
    50, 1000, all): above 1 the step breaks the contract (hatched)."""
    pairs = _forced_pairs(report)
    figure = Figure(figsize=(10, 0.9 + 1.7 * max(len(pairs), 1)), layout="constrained")
    axes = figure.subplots(max(len(pairs), 1), 1, squeeze=False)[:, 0]
    image = None
    for axis, pair in zip(axes, pairs, strict=False):
        steps = pair["forced"]["steps"]
        used = np.array([[s["topk"][key]["tolerance_used"] or 0.0 for s in steps] for key in KEYS], dtype=float)
        image = axis.imshow(np.log10(np.maximum(used, 1e-7)), aspect="auto", cmap="magma", vmin=-6, vmax=1)
        for row, key in enumerate(KEYS):
            for column, step in enumerate(steps):
                if step["topk"][key]["status"] == "fail":
                    axis.text(column, row, "x", ha="center", va="center", color="#00e0ff", fontsize=9)
        axis.set_yticks(range(len(KEYS)), [key.rsplit(".", 1)[1] for key in KEYS])
        axis.set_title(f"{pair['candidate']} vs {pair['reference']}", fontsize=9)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are counted
        axis.set_xlabel("teacher-forced step")
    if image is not None:
        figure.colorbar(image, ax=list(axes), label="log10 tolerance used (x: fails)")
    return describe(figure, f"Top-k tolerance used per teacher-forced step for {len(pairs)} pairs.")


def forced_margin_plot(report: Report) -> Figure:
    """Per pair: the reference's top-1 minus top-2 margin at each teacher-forced step, the error band the
    candidate's policy allows on it (shaded), the candidate's own error on that margin, and each flip marked
    with its label (near-tie: inside the band; confident: above it)."""
    from .axes import EXACT_AT, from_numbers, legend_markers, log_range, markers

    pairs = _forced_pairs(report)
    figure = Figure(figsize=(10, 0.6 + 2.4 * max(len(pairs), 1)), layout="constrained")
    axes = figure.subplots(max(len(pairs), 1), 1, squeeze=False)[:, 0]
    for axis, pair in zip(axes, pairs, strict=False):
        steps = pair["forced"]["steps"]
        x = np.arange(len(steps))
        # an exact zero (a tie, an error-free step) is a marker along the bottom, never a value at a floor
        margin = from_numbers(s["reference_margin"] for s in steps)
        error = from_numbers(abs(s["error_top1"] - s["error_top2"]) for s in steps)
        allowed = np.array([s["allowed"] for s in steps], dtype=float)
        bottom, top = log_range([margin.values, error.values, allowed])
        axis.fill_between(x, bottom, np.maximum(allowed, bottom), color="#9ecae1", alpha=0.6,
                          label="allowed error on the margin")  # fmt: skip
        axis.plot(x, margin.values, marker="o", color="#08519c", label="reference margin (top-1 minus top-2)")
        axis.plot(x, error.values, marker="x", linestyle=":", color="#636363", label="candidate's error on it")
        markers(axis, x, margin, "#08519c")
        markers(axis, x, error, "#636363")
        legend_markers(axis, [margin, error])
        for flip in pair["forced"].get("flips", []):
            color = "#d62728" if flip["label"] == "confident" else "#ff7f0e"
            axis.axvline(flip["step"], color=color, linestyle="--", linewidth=1)
            at = flip["reference_margin"]
            if at > 0:
                axis.annotate(flip["label"], (flip["step"], at), color=color, fontsize=8)
            else:  # a tie: the label sits by its "exactly equal" marker
                axis.annotate(flip["label"], (flip["step"], EXACT_AT), xycoords=axis.get_xaxis_transform(),
                              color=color, fontsize=8)  # fmt: skip
        axis.set_yscale("log")  # round-off errors and logit margins are decades apart
        axis.set_ylim(bottom, top)
        axis.set_title(f"{pair['candidate']} vs {pair['reference']}", fontsize=9)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are counted
        axis.set_xlabel("teacher-forced step")
        axis.set_ylabel("logit")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    return describe(figure, f"Reference margins, error bands and flip labels for {len(pairs)} pairs.")


def dropped_words_frame(report: Report):
    """Per pair and expected word the candidate's free-running text lacks: whether the reference says it, the
    step and token that say it, and that token's rank in the candidate's teacher-forced logits there."""
    import pandas as pd

    records = []
    for pair in (report.data.get("answer") or {}).get("pairs", []):
        for entry in pair.get("dropped_words") or []:
            step, rank = entry.get("reference_step"), entry.get("candidate_rank")
            if not entry["in_reference"]:  # neither runtime says it: nothing this candidate dropped
                continue
            records.append(
                {
                    "candidate": pair["candidate"],
                    "word": entry["word"],
                    "at step": "" if step is None else step,
                    "reference token": entry.get("reference_token", ""),
                    "candidate's top token there": entry.get("candidate_token", ""),
                    "its rank in the candidate (0: kept)": "" if rank is None else rank,
                    "lost there": "" if rank is None else ("yes" if rank > 0 else "no: lost earlier"),
                }
            )
    return pd.DataFrame(records)


def dropped_words_note(report: Report) -> str:
    """What the dropped-words table leaves out: the expected words no runtime's text says (``""``: none)."""
    answer = report.data.get("answer") or {}
    expect = list(answer.get("expect") or [])
    said = {
        w
        for entry in (answer.get("runtimes") or {}).values()
        for w, ok in (entry.get("expected_words") or {}).items()
        if ok
    }
    unsaid = [w for w in expect if w not in said]
    if not expect:
        return "The parameter file expects no words (`text.expect`)."
    if not unsaid:
        return ""
    return f"No runtime's text says {', '.join(unsaid)}: no candidate dropped {'it' if len(unsaid) == 1 else 'them'}."
