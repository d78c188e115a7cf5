"""The finding banner: what a failing pair's first screen says before any table (notebooks 01 and 02).

Per failing pair, in a few lines: the mechanism in words (the family's known defect for the operator the replay says
introduces the error, from its ``CLOSES`` declaration, and what the ready patch does, from its docstring; else the
replay's conclusion), the ready patch as the run tried it on that block (before and after, ``report.json
["patch_trials"]``), and for quantized runs the closer-to attribution and the same-input linear replay, named for the
module both speak of (a fused query-key-value linear is one module, its q, k and v three stages).
"""

from __future__ import annotations

from driftscope.core.markup import code, text
from driftscope.run.report import Report

from .cause import SHOWN_OPERATORS, cause_text, introduced_groups, patch_text


def _family(report: Report):
    from driftscope.families import get_family

    family = report.data.get("family")
    return get_family(family) if family else None


def known_defect(report: Report, key: str) -> tuple[str | None, dict]:
    """The ready patch the finding speaks of (the one the run tried, else the first the family declares for the
    introduced operator) and what the family knows of its defect (``Family.defect_of``)."""
    trial = (report.data.get("patch_trials") or {}).get(key) or {}
    conclusion = report.conclusion(key)
    patches = [trial["patch"]] if trial.get("patch") else list(conclusion.get("ready_patches") or [])
    if not patches and conclusion.get("kind") == "introduced":
        patches = [p for group in introduced_groups(report, key) for p in group["patches"]]
    family = _family(report)
    for patch in patches:
        known = family.defect_of(patch) if family else {}
        if known.get("defect"):
            return patch, known
    return (patches[0] if patches else None), {}


def where_markdown(report: Report, key: str) -> str:
    """Where the error is introduced, each operator once with the blocks it recurs in (Markdown), e.g.
    ``vision.block.*.mlp.act`` (blocks 0-4; replayed whole, blocks 0-24 introduce error too); for a pair whose
    error is not introduced by an operator, its suspected cause in words."""
    conclusion = report.conclusion(key)
    if conclusion.get("kind") != "introduced":
        return text(cause_text(report, key))
    parts = []
    for group in introduced_groups(report, key)[:SHOWN_OPERATORS]:
        notes = [] if len(group["stages"]) == 1 else [group["where"]]
        verb = "introduces" if group.get("within_count") == 1 else "introduce"
        notes += [f"replayed whole, {group['within']} {verb} error too"] if group["within"] else []
        name = group["stages"][0] if len(group["stages"]) == 1 else group["operator"]
        parts.append(code(name) + (f" ({text('; '.join(notes))})" if notes else ""))
    return "; ".join(parts)


def docstring(said: str) -> str:
    """A docstring's sentence as Markdown: its ````literals```` as code, the rest escaped, no final full stop."""
    parts = said.strip().rstrip(".").split("``")
    return "".join(code(part) if index % 2 else text(part) for index, part in enumerate(parts))


def _share(value) -> str:
    return "not compared" if value is None else f"{value:.3g}"


def trial_line(report: Report, key: str, named: bool = False) -> str:
    """The ready patch as the run tried it: the block (or stage), its worst stage before and after, and whether
    it closes the error there; or why it was not tried. ``named``: the sentence before named the patch."""
    trial = (report.data.get("patch_trials") or {}).get(key)
    if not trial:
        suggested = patch_text(report, key)
        return (
            f"Ready patch: {code(suggested)} (not tried by the run)." if suggested not in ("", "none declared") else ""
        )
    patch = code(trial["patch"].rsplit(":", 1)[-1])
    if trial["status"] != "tried":
        return f"Ready patch {patch}: {text(trial['status'])} ({text(trial.get('why', ''))})."
    where = f"block {trial['block']}" if trial.get("block") is not None else ", ".join(map(code, trial["stages"]))
    rows = trial.get("rows") or []
    stage = report.conclusion(key).get("stage")
    shown = next((row for row in rows if row["stage"] == stage), None)  # where the error is introduced
    shown = shown or max(rows, key=lambda row: row.get("before_used") or 0.0, default=None)
    change = ""
    if shown is not None:
        change = (
            f": {code(shown['stage'])} {text(shown['before'])} -> **{text(shown['after'])}**, tolerance used "
            f"{_share(shown['before_used'])} -> {_share(shown['after_used'])}"
        )
    verdict = (
        f"no stage of {where} fails with it"
        if trial.get("closes")
        else f"{len(trial.get('failing_after') or [])} stage(s) still fail: "
        + ", ".join(code(s) for s in trial.get("failing_after") or [])
    )
    said = "It was" if named else f"Ready patch {patch}"
    return f"{said} **tried on {where}** by the run ({trial.get('seconds', 0):.1f} s){change}; {verdict}."


def one_module(stage: str, rows: list[dict]) -> tuple[dict | None, list[str]]:
    """The quantized linear (a linear replay row) that computes ``stage``, and every stage it computes: the row of
    ``stage`` itself, else the row of a sibling stage whose module computes it too (``attn.q`` beside ``attn.v``,
    both of ``attn.qkv``: the module's last name holds each sibling's last name)."""
    parent, name = stage.rsplit(".", 1) if "." in stage else ("", stage)
    for row in rows:
        if row["stage"] == stage:
            return row, [stage]
    for row in rows:
        other_parent, other = row["stage"].rsplit(".", 1) if "." in row["stage"] else ("", row["stage"])
        fused = str(row.get("module") or "").rsplit(".", 1)[-1]
        if other_parent == parent and name in fused and other in fused and len(name) == len(other) == 1:
            ordered = sorted({stage, row["stage"], *(f"{parent}.{c}" for c in fused if c in "qkv")}, key=fused.find)
            return row, sorted(ordered, key=lambda s: fused.find(s.rsplit(".", 1)[-1]))
    return None, []


def quantized_mechanism(report: Report, key: str) -> str:
    """For a quantized pair whose replay and same-input linear replay agree on the module that introduces the error,
    one answer for that module (Markdown): what introduces it (the fused kernel, the activation dtype), the module and
    every stage it computes (q, k and v of a fused qkv are one), and how many other quantized linears do the same."""
    linear = (report.data.get("linear_replay") or {}).get(key)
    stage = report.conclusion(key).get("stage")
    if not linear or not stage:
        return ""
    from driftscope.capture.linear_controls import CAUSES

    rows = linear.get("rows") or []
    row, stages = one_module(stage, rows)
    if row is None or row.get("label") not in CAUSES or row["label"] == "none":
        return f"Same-input linear replay: {text(linear['verdict'].split(': ', 1)[-1])}" if linear else ""
    others = [
        r for r in rows if r is not row and r.get("label") == row["label"] and r.get("stage_label") == "introduced"
    ]
    activations = f" on {text(linear.get('activations'))} activations" if linear.get("activations") else ""
    said = (
        f"{text(CAUSES[row['label']])}{activations} introduces the error at the quantized linear "
        f"{code(row['module'])} ({', '.join(code(s) for s in stages)}): replayed on the reference's own input, its "
        f"fused path is {row['fused_vs_dequantized']:.2g} (relative RMS) from the same codes dequantized, which are "
        f"{row['dequantized_vs_reference']:.2g} from the reference"
    )
    return said + (f"; so do {len(others)} more quantized linears" if others else "")


def accumulation_markdown(report: Report, key: str, conclusion: dict) -> str:
    """Drift no operator introduces, in words: the candidate's rounding (its activation dtype) accumulating from
    the onset, and where it is amplified most (the table beside it says where it first breaks the contract)."""
    dtype = report.activations(key)
    onset = conclusion.get("onset") or conclusion.get("first_divergence")
    rounding = f"{text(dtype)} rounding" if dtype else "rounding"
    said = f"{rounding} accumulates from {code(onset)} on"
    chain = conclusion.get("amplified") or []
    if chain:
        strongest = max(chain, key=lambda link: link.get("factor") or 0.0)
        said += f", amplified most at {code(strongest['stage'])}" + (
            f" (x{strongest['factor']:.3g})" if strongest.get("factor") else ""
        )
    return said + "; no single operator introduces it"


def attribution_line(report: Report, key: str) -> str:
    """The closer-to attribution's verdict, on the pages of the pairs it speaks of."""
    attribution = report.data.get("attribution") or {}
    if attribution and key in (attribution.get("candidate"), *(attribution.get("references") or [])):
        return f"Closer-to attribution: {text(attribution.get('verdict', ''))}."
    return ""


def finding_markdown(report: Report, key: str) -> str:
    """One pair's banner (Markdown): the mechanism, the patch tried, the quantized attribution; "" for a pair that
    passes or has no conclusion."""
    verdict = ((report.data.get("verdict") or {}).get("per_candidate") or {}).get(key)
    conclusion = report.conclusion(key)
    yardstick = key in ((report.data.get("verdict") or {}).get("yardsticks") or {})
    if verdict in (None, "pass") or yardstick or conclusion.get("kind") in (None, "agreement"):
        return ""
    patch, known = known_defect(report, key)
    quantized = quantized_mechanism(report, key)
    if known.get("defect"):
        mechanism = f"{text(known['defect'])}; introduced at {where_markdown(report, key)}"
        if known.get("patch"):
            mechanism += f". The ready patch {code(patch.rsplit(':', 1)[-1])}: {docstring(known['patch'])}"
    elif quantized:
        mechanism = quantized
    elif conclusion.get("kind") == "introduced":
        mechanism = f"introduced at {where_markdown(report, key)}; the family declares no defect there"
    elif conclusion.get("kind") == "accumulation":
        mechanism = accumulation_markdown(report, key, conclusion)
    else:
        mechanism = where_markdown(report, key) or text(conclusion.get("text", ""))
    lines = [f"**Finding, {code(report.pair_title(key))}**: {mechanism}."]
    named = bool(known.get("patch")) and patch == ((report.data.get("patch_trials") or {}).get(key) or {}).get("patch")
    lines += [line for line in (trial_line(report, key, named), attribution_line(report, key)) if line]
    return "\n\n".join(lines)


def banners(report: Report) -> list[str]:
    """Every failing pair's banner as one Markdown list item (its lines run on), in the report's order."""
    found = [finding_markdown(report, key) for key in report.pair_keys()]
    return ["- " + said.replace("\n\n", " ") for said in found if said]
