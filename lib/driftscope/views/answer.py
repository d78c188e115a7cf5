"""Tables and figures of notebook 06 (answer parity)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..markup import code
from ..report import Report


def texts_frame(report: Report):
    """Decoded greedy texts side by side, with the expected words each one contains."""
    import pandas as pd

    answer = report.data.get("answer") or {}
    records = []
    for label, entry in answer.get("runtimes", {}).items():
        found = entry["expected_words"]
        records.append(
            {
                "runtime": label,
                "prefill top-1": entry["prefill_top1"],
                "text": entry["text"],
                "tokens": " ".join(map(str, entry["tokens"])),
                "expected words found": ", ".join(w for w, ok in found.items() if ok) or "-",
                "missing": ", ".join(w for w, ok in found.items() if not ok) or "-",
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
                "identical": pair["identical"],
                "first differing step": pair["first_difference"],
                "reference token": pair["reference_token"],
                "candidate token": pair["candidate_token"],
                "prefill top-1 agree": pair["prefill_top1_agree"],
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
    return frame[
        [
            "stage",
            "role",
            "pair",
            "status",
            "failures",
            "max_abs",
            "rms",
            "top1_agree",
            "top5_overlap",
            "margin_reference",
            "margin_candidate",
            "note",
        ]
    ]


def vision_link(report: Report) -> list[str]:
    """For each pair, the first divergent vision stage (where to look next) next to its first text divergence."""
    lines = []
    for key in report.pair_keys():
        rows = [r for r in report.rows if (r.pair or r.candidate) == key and r.failed]
        vision = next((r.stage for r in rows if r.stage.startswith("vision.")), None)
        text = next((r.stage for r in rows if r.stage.startswith("text.")), None)
        lines.append(
            f"- {code(report.pair_title(key))}: first vision divergence {code(vision)}, "
            f"first text divergence {code(text)}"
        )
    return lines


def margin_plot(report: Report) -> Figure:
    """Top-1 minus top-2 logit along the generated sequence, one line per runtime; differing steps marked."""
    answer = report.data.get("answer") or {}
    figure = Figure(figsize=(10, 3.4), layout="constrained")
    axis = figure.subplots()
    for label, entry in answer.get("runtimes", {}).items():
        axis.plot(np.arange(len(entry["margins"])), entry["margins"], marker="o", markersize=3, label=label)
    for pair in answer.get("pairs", []):
        if pair["first_difference"] is not None:
            axis.axvline(pair["first_difference"], color="#d62728", linestyle="--", linewidth=1)
    axis.set_xlabel("generated step")
    axis.set_ylabel("top-1 minus top-2 logit")
    axis.set_title("logit margin along the greedy sequence (dashed: first differing token)")
    axis.legend(fontsize=8)
    axis.grid(True, alpha=0.3)
    return figure
