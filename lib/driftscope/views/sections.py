"""A page shows a section only where the run has something for it, and says in one line what it left out and why.

Each optional section of notebooks 01, 02 and 06 is declared here once: its heading, the paragraph under it, when
the run has something for it, and why it is left out otherwise. A notebook asks :func:`show` before drawing the
section (it displays the heading and paragraph, or nothing) and :func:`left_out` near its top (one line naming
every section the page leaves out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from driftscope.run.report import Report


@dataclass(frozen=True)
class Section:
    page: str
    title: str
    intro: str
    applies: Callable[..., bool]
    why_not: str  # why the page leaves it out, said after its title
    level: int = 2
    part_of: str | None = None  # a subsection: left out with its section, said there once


def _answer(report: Report) -> dict:
    return report.data.get("answer") or {}


def _forced(report: Report, **_) -> bool:
    return any(pair.get("forced") for pair in _answer(report).get("pairs", []))


def _quantized(report: Report, **_) -> bool:
    runtimes = any(r.get("quantization") for r in report.data.get("runtimes", []))
    return runtimes or bool(report.data.get("attribution") or report.data.get("linear_replay"))


def _substituted(report: Report, **_) -> bool:
    entries = [pair.get("substitution") for pair in _answer(report).get("pairs", [])]
    return any(entry and entry.get("status") != "not_needed" for entry in entries)


def _three_way(report: Report, **_) -> bool:
    return bool((_answer(report).get("three_way") or {}).get("candidates"))


def _dropped(report: Report, **_) -> bool:
    pairs = _answer(report).get("pairs", [])
    return any(entry.get("in_reference") for pair in pairs for entry in pair.get("dropped_words") or [])


def _cache(report: Report, **_) -> bool:
    return any(pair.get("cache") for pair in _answer(report).get("pairs", []))


def _differs(report: Report, **_) -> bool:
    return any(pair.get("first_difference") is not None for pair in _answer(report).get("pairs", []))


def _replayed(report: Report, pair: str | None = None, **_) -> bool:
    return bool((report.data.get("replay") or {}).get(pair))


def _replay_rows(report: Report, pair: str | None = None, layers=(), **_) -> bool:
    from .drill import replay_frame

    return bool(pair) and not replay_frame(report, pair, list(layers or [])).empty


def _maps(report: Report, stage: str | None = None, **_) -> bool:
    return bool(stage) and stage in report.plan and not report.plan[stage].integer


def _read_from_models(report: Report, **_) -> bool:
    return (report.data.get("plan_meta") or {}).get("generic") is not None


SECTIONS: dict[str, Section] = {
    "read_from_models": Section(
        "01",
        "What was read from the models",
        "The stages were read from the two models themselves (the generic family): the modules of either library "
        "with no partner on the other side, and the stages whose layout no rule decides, each with why: none of them "
        "is compared, and the stages around them are.",
        _read_from_models,
        "the family declares its stages, so every one is compared as declared",
    ),
    "introduced": Section(
        "02",
        "Introduced, inherited or amplified (every block)",
        "",
        _replayed,
        "the pair's candidate was not replayed on the reference's inputs",
    ),
    "replay_rows": Section(
        "02",
        "Replay comparisons (op-local rows of the chosen layers)",
        "",
        _replay_rows,
        "no stage of the chosen blocks was replayed",
    ),
    "maps": Section(
        "02",
        "Outlier channel map",
        "Where the chosen stage's error lives: which channels and tokens, then by magnitude and over the image.",
        _maps,
        "the stage for the maps is exact (an index or a mask: it has no channels to speak of), or there is none",
    ),
    "quantized": Section(
        "02",
        "Quantized weights: the fused kernel or the dequantized weights?",
        "What each runtime quantized (and which layers stayed dense), which reference the `attribution` candidate is "
        "closer to at every stage (relative RMS; the verdict counts the blocks), and each quantized linear replayed on "
        "the reference's own input through MLX's fused kernel and as a dense matmul with the same codes dequantized: "
        "whether its error is introduced by the fused kernel, by the activation dtype, or inherited.",
        _quantized,
        "no runtime of this run is quantized and it has no attribution",
    ),
    "forced": Section(
        "06",
        "Teacher-forced: where the answer first diverges",
        "Every candidate that decodes was also fed the reference's greedy tokens, so each step asks both runtimes the "
        "same question. Per candidate: the first step whose logits on the reference's top-k tokens (k = 5, 50, 1000, "
        "all) break the contract's `text.forced.top*` tolerance, the free-running first differing token, and each "
        "teacher-forced flip of the argmax with its label: **near-tie** when the reference's margin `r[a] - r[t]` is "
        "within the error the candidate's policy allows on it (`tol(r[a]) + tol(r[t])`, `tol(x) = atol + rtol·|x|` "
        "under `text.forced.top5`, at least one ulp of each in the policy's dtype), **confident** (evidence of a "
        "defect) when above it.",
        _forced,
        "no candidate decoded teacher-forced",
    ),
    "topk_map": Section(
        "06",
        "Top-k tolerance maps",
        "The share of its tolerance the worst of the reference's top-k tokens uses at each step; `x` marks a step "
        "that breaks it.",
        _forced,
        "",
        level=3,
        part_of="forced",
    ),
    "margins": Section(
        "06",
        "Margins against the error band",
        "The reference's top-1 minus top-2 margin at each teacher-forced step, the error the candidate may make on it "
        "(shaded) and the error it made; a dashed line marks a flip with its label.",
        _forced,
        "",
        level=3,
        part_of="forced",
    ),
    "substitution": Section(
        "06",
        "Which side caused it: substitution",
        "For each pair whose teacher-forced answer flips or breaks a top-k tolerance, the candidate's text side was "
        "run on the reference's merged image embeddings (`text.embeds.image`) and the reference's text side on the "
        "candidate's, both fed the reference's tokens. The candidate's side agreeing with the reference's tower, and "
        "the reference's diverging with the candidate's: **the tower's output explains it**; the other way round: "
        "**the text side explains it**.",
        _substituted,
        "no pair's teacher-forced answer flips or breaks a top-k tolerance, so no side needed substituting",
        level=3,
    ),
    "three_way": Section(
        "06",
        "Three-way: what half precision costs",
        "Each candidate's forced-logit error against the reference next to a half-precision peer's own (the "
        "`relative: {peer: ...}` runtime, or the first in bf16/f16): the ratio of their RMS and the overlap of the "
        "two error distributions. Within the contract's `peer_factor`: **within what half precision costs** (said of "
        "any candidate, float32 ones too); above it: **something else**. The KV cache the same way, per cache stage "
        "and decoder layer: the first layer beyond its bound is where something else starts.",
        _three_way,
        "the run has no half-precision runtime (bf16 or f16) to set the candidates against",
        level=3,
    ),
    "dropped": Section(
        "06",
        "Expected words each candidate drops",
        "For each expected word the reference's free-running text says and a candidate's lacks: the step at which the "
        "reference's token says it, and that token's rank among the candidate's teacher-forced logits there (0: the "
        "candidate would have said it too, so its answer went elsewhere earlier).",
        _dropped,
        "no candidate drops an expected word the reference says",
        level=3,
    ),
    "cache": Section(
        "06",
        "The KV cache, per layer and head",
        "Each decoder layer's cached keys (after RoPE) and values of every position, at the end of the prefill and "
        "after the last teacher-forced step (prompt plus the reference's tokens: the same inputs in every runtime). "
        "Per pair: which layer's cache first differs, at which step (one numbering on this page: step 0 is the "
        "prefill, step i the decode call that feeds token i - 1 at position prompt length + i - 1 and gives token i) "
        "and head; then the teacher-forced cache's relative error per layer and head.",
        _cache,
        "no runtime's KV cache was compared",
        level=3,
    ),
    "first_token": Section(
        "06",
        "First differing token (free-running)",
        "Per pair whose free-running answers differ: the first differing step, both tokens and the margins around it.",
        _differs,
        "every pair's free-running tokens are identical",
    ),
}


def show(report: Report, key: str, **context) -> bool:
    """Display section ``key``'s heading and paragraph when the run has something for it; whether it does."""
    section = SECTIONS[key]
    if not section.applies(report, **context):
        return False
    from IPython.display import Markdown, display

    display(Markdown("\n\n".join(filter(None, [f"{'#' * section.level} {section.title}", section.intro]))))
    return True


def left_out(report: Report, page: str, **context) -> str:
    """One line naming every section of ``page`` (``"02"``) the run has nothing for, each with why; "" when none."""
    missing = [
        f"*{section.title}* ({section.why_not})"
        for section in SECTIONS.values()
        if section.page == page and section.part_of is None and not section.applies(report, **context)
    ]
    return f"Not on this page, as this run has nothing for them: {'; '.join(missing)}." if missing else ""
