"""Tables and figures of notebook 06 (answer parity)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from driftscope.core.markup import code
from driftscope.run.report import Report

from .forced import escaped
from .notebook import describe, family_text


def text_side_note(report: Report) -> str:
    """What the run's family's text side carries besides its layers, in the family's words (``""``: nothing)."""
    said = family_text(report, "answer")
    return f"Besides the text layers, this family's text side carries {said}." if said else ""


def random_weights_note(report: Report) -> str:
    """A plain warning when the checkpoint has random weights (a driftscope fixture), else ``""``."""
    storage = report.data.get("checkpoint_storage") or {}
    marked = storage.get("random_weights")
    if marked is None:  # a report written before this was recorded
        marked = (Path(str(report.data.get("checkpoint", ""))) / "driftscope_fixture.json").exists()
    if not marked:
        return ""
    return (
        "**This checkpoint has random weights** (a driftscope fixture): its decoded text is meaningless and no "
        "expected word can appear. Compare the token ids, the prefill top-1 and the margins instead."
    )


def readable(entry: dict) -> str:
    """A runtime's decoded text as a reader can take it: where tokens decode to bytes that are no whole UTF-8
    character (a random-weight model's, U+FFFD in the text), each such token as its id, e.g. ``⟨id 241⟩``, the others
    as their text (control characters escaped)."""
    pieces = entry.get("pieces")
    if pieces is None:
        said = entry.get("text", "")
        return escaped(said) if "\ufffd" not in said else escaped(said).replace("\\ufffd", "⟨undecodable⟩")
    return "".join(
        escaped(piece) if piece is not None else f"⟨id {token}⟩"
        for piece, token in zip(pieces, entry["tokens"], strict=False)
    )


def _prefill_rows(report: Report) -> dict[str, dict]:
    """Each candidate's prefill logits against the main reference's (its ``text.logits.last`` row's extra)."""
    reference = report.data.get("reference")
    found = {}
    for row in report.rows:
        if row.stage == "text.logits.last" and row.reference == reference and row.extra:
            found[row.candidate] = row.extra
    return found


def texts_frame(report: Report):
    """One row per runtime: prefill top-1 (and whether it agrees with the reference's), top-5 overlap and
    margin, then the greedy tokens and text with the expected words (runtimes that do not decode say so)."""
    import pandas as pd

    answer = report.data.get("answer") or {}
    decoded = answer.get("runtimes", {})
    prefill = _prefill_rows(report)
    reference = report.data.get("reference")
    records = []
    for runtime in report.data.get("runtimes", []):
        label = runtime["label"]
        entry, logits = decoded.get(label), prefill.get(label, {})
        if entry is None and not logits:
            continue
        top1 = entry["prefill_top1"] if entry else logits.get("top1_candidate")
        found = (entry or {}).get("expected_words") or {}
        records.append(
            {
                "runtime": label,
                "prefill top-1": top1,
                "top-1 agrees": "reference" if label == reference else ("yes" if logits.get("top1_agree") else "no"),
                "top-5 overlap": 1.0 if label == reference else logits.get("top5_overlap"),
                "prefill margin": logits.get("margin_candidate", ((entry or {}).get("margins") or [None])[0]),
                "tokens": " ".join(map(str, entry["tokens"])) if entry else "does not decode (prefill only)",
                "text": readable(entry) if entry else "",
                "expected words found": (", ".join(w for w, ok in found.items() if ok) or "none") if entry else "",
            }
        )
    return pd.DataFrame(records)


def first_token_frame(report: Report):
    """Per pair: identical or the first differing step, both tokens, and the margins around it."""
    import pandas as pd

    answer = report.data.get("answer") or {}
    records = []
    for pair in answer.get("pairs", []):
        around = "; ".join(
            f"step {m['step']}: {m['reference']:.3g} vs {m['candidate']:.3g}" for m in pair["margins_around"]
        )
        records.append(
            {
                "pair": f"{pair['candidate']} vs {pair['reference']}",
                "identical": "yes" if pair["identical"] else "no",
                "first differing step": "none" if pair["first_difference"] is None else pair["first_difference"],
                "reference token": "" if pair["reference_token"] is None else pair["reference_token"],
                "candidate token": "" if pair["candidate_token"] is None else pair["candidate_token"],
                "prefill top-1 agrees": {True: "yes", False: "no"}.get(pair["prefill_top1_agree"], "not said"),
                "margins around (reference vs candidate)": around,
            }
        )
    return pd.DataFrame(records)


def text_stage_frame(report: Report):
    """The rows between the tower and the logits: what the text side reads of the tower (the plan's
    ``tower_outputs``: the merged features and any features injected into the decoder's layers), then the
    embeddings, positions, layers and logits (with top-1 agreement and margins)."""
    frame = report.frame()
    if frame.empty:
        return frame
    feeds = set(report.data.get("plan_meta", {}).get("tower_outputs") or ())

    def kept(stage: str) -> bool:
        return stage.startswith("text.") or stage in feeds

    rows = [r for r in report.rows if kept(r.stage)]
    frame = frame[frame["stage"].map(kept)].reset_index(drop=True)
    frame["role"] = ["tower output the text side reads" if stage in feeds else "text" for stage in frame["stage"]]
    for key in ("top1_agree", "top5_overlap", "margin_reference", "margin_candidate"):
        frame[key] = [row.extra.get(key) for row in rows]
    frame["top1_agree"] = [{True: "yes", False: "no"}.get(value, "") for value in frame["top1_agree"]]
    return frame[list(STAGE_COLUMNS)].rename(columns=STAGE_COLUMNS)


#: the stage table's columns and their headers
STAGE_COLUMNS = {
    "stage": "stage",
    "role": "role",
    "pair": "pair",
    "status": "status",
    "failures": "failures",
    "max_abs": "max |difference|",
    "rms": "RMS difference",
    "top1_agree": "top-1 agrees",
    "top5_overlap": "top-5 overlap",
    "margin_reference": "reference margin",
    "margin_candidate": "candidate margin",
    "note": "note",
}


def vision_link(report: Report) -> list[str]:
    """For each pair, its first divergent vision stage (where to look next) next to its first text divergence."""
    lines = []
    failed = [r for r in report.rows if r.failed]
    for key in report.pair_keys():
        rows = [r for r in failed if (r.pair or r.candidate) == key]
        vision = next((r.stage for r in rows if r.stage.startswith("vision.")), None)
        text = next((r.stage for r in rows if r.stage.startswith("text.")), None)
        where = f"first vision divergence {code(vision)}" if vision else "every vision stage passes"
        after = f"first text divergence {code(text)}" if text else "every text stage passes"
        lines.append(f"- {code(report.pair_title(key))}: {where}; {after}")
    return lines


def margin_plot(report: Report) -> Figure:
    """Top-1 minus top-2 logit along the generated sequence, one line per runtime; differing steps marked."""
    answer = report.data.get("answer") or {}
    figure = Figure(figsize=(10, 3.4), layout="constrained")
    axis = figure.subplots()
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    for index, (label, entry) in enumerate(answer.get("runtimes", {}).items()):
        axis.plot(  # hollow markers of shrinking size and own dashes: runtimes whose margins coincide stay visible
            np.arange(len(entry["margins"])),
            entry["margins"],
            marker=markers[index % len(markers)],
            markersize=10 - 1.2 * (index % 6),
            markerfacecolor="none",
            linewidth=1.0,
            linestyle=["-", "--", ":", "-."][index % 4],
            label=label,
        )
    for pair in answer.get("pairs", []):
        if pair["first_difference"] is not None:
            axis.axvline(pair["first_difference"], color="#d62728", linestyle="--", linewidth=1)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are counted
    axis.set_xlabel("generated step")
    axis.set_ylabel("top-1 minus top-2 logit")
    axis.set_title("logit margin along the greedy sequence (dashed: first differing token)")
    axis.legend(fontsize=8)
    axis.grid(True, alpha=0.3)
    runtimes = len(answer.get("runtimes", {}))
    return describe(figure, f"Top-1 minus top-2 logit at each generated step for {runtimes} runtimes.")
