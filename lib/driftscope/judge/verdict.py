"""The verdict of a run from its TapSets: each pair's rows, first divergence (and the lineage of its worst row),
growth stages, drift onsets, what was not compared and why."""

from __future__ import annotations

from driftscope.judge.compare import ComparisonRow, compare_tapsets, first_divergence, growth_stages
from driftscope.judge.contract import Contract
from driftscope.judge.coverage import COMPARED, pair_coverage
from driftscope.judge.decode_site import decode_site
from driftscope.judge.lineage import row_lineage
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

DRIFT_FLOOR = 1e-4  # relative RMS above which a stage counts as drifting (float32 round-off is ~1e-7)


def pair_key(reference: str, candidate: str, main_reference: str) -> str:
    """How a runtime pair is named in the report: the candidate's label when judged against the main reference."""
    return candidate if reference == main_reference else f"{candidate} vs {reference}"


def judge(
    reference: TapSet,
    candidates: list[TapSet],
    contract: Contract,
    plan: StagePlan,
    extra_pairs: list[tuple[TapSet, TapSet]] = (),
    compared: dict[tuple[str, str], list[ComparisonRow]] | None = None,
    narrowed: dict[str, tuple] | None = None,
) -> dict:
    """Rows, first divergences (and the lineage of their worst row), growth stages, drift onsets and the verdict
    for every runtime pair.

    Pairs are the reference against each candidate, then ``extra_pairs`` (e.g. mlx against iree).
    ``compared`` holds rows already computed under this contract, by (reference, candidate) label; ``narrowed``
    the (reference, candidate) TapSets, with the stages narrowing added, of each narrowed candidate's pair.
    """
    rows: list[ComparisonRow] = []
    first: dict[str, dict | None] = {}
    growth: dict[str, list[dict]] = {}
    onset: dict[str, str | None] = {}
    absent: dict[str, list[dict]] = {}
    coverage: dict[str, dict] = {}
    per_candidate: dict[str, str] = {}
    reasons: list[str] = []
    pairs_out: list[dict] = []
    lineage: dict[str, dict | None] = {}
    side = {stage.id for stage in plan if stage.side}
    for ref, candidate in [(reference, c) for c in candidates] + list(extra_pairs):
        key = pair_key(ref.label, candidate.label, reference.label)
        if ref is reference and candidate.label in (narrowed or {}):
            ref, candidate = narrowed[candidate.label]
        pairs_out.append({"key": key, "reference": ref.label, "candidate": candidate.label})
        pair_rows = (compared or {}).get((ref.label, candidate.label)) or compare_tapsets(
            ref, candidate, contract, plan
        )
        for row in pair_rows:
            row.pair = key
        rows.extend(pair_rows)
        divergence = first_divergence(pair_rows)
        first[key] = None if divergence is None else _divergence_record(divergence)
        site = decode_site(pair_rows, ref, candidate, contract, plan) if divergence is not None else None
        if site is not None:  # a decode-only defect: its step, and the layer and position or the position stage
            first[key]["decode"] = site
        lineage[key] = None
        if first[key] and first[key]["max_coords"] and divergence.status == "fail":
            lineage[key] = row_lineage(ref, candidate, plan, contract, divergence.stage, first[key]["max_coords"])
        growth[key] = growth_stages(pair_rows, contract.growth_factor, side=side)
        onset[key] = next((row.stage for row in pair_rows if not row.integer and row.relative_rms > DRIFT_FLOOR), None)
        absent[key] = not_compared(pair_rows, ref, candidate)
        coverage[key] = pair_coverage(pair_rows, plan, absent[key], ref, candidate)
        compared_rows = [row for row in pair_rows if row.status in COMPARED]
        failed = divergence is not None or not compared_rows or not coverage[key]["complete"]
        per_candidate[key] = "fail" if failed else "pass"
        if site is not None:
            reasons.append(f"{key}: {site['text']} (first divergent stage {divergence.stage})")
        elif divergence is not None:
            reasons.append(f"{key}: first divergence at {divergence.stage} ({_divergence_reason(divergence)})")
        if not compared_rows:
            reasons.append(f"{key}: no stage was compared (every stage skipped by the contract or missing)")
        reasons += [f"{key}: {problem}" for problem in coverage[key]["problems"]]
        for row in pair_rows:
            if row.warning:
                reasons.append(f"{key}: {row.stage}: {row.warning}")
    warnings = contract.warnings(plan.ids())
    status = "fail" if any(v == "fail" for v in per_candidate.values()) else "pass"
    return {
        "pairs": pairs_out,
        "rows": [row.to_dict() for row in rows],
        "first_divergence": first,
        "lineage": lineage,
        "growth": growth,
        "drift_onset": onset,
        "not_compared": {key: groups for key, groups in absent.items() if groups},
        "coverage": coverage,
        "warnings": warnings,
        "verdict": {
            "status": status,
            "per_candidate": per_candidate,
            "reasons": reasons,
            "judged": {key: record["judged_fraction"] for key, record in coverage.items()},  # judge.coverage
        },
    }


def not_compared(rows: list[ComparisonRow], reference: TapSet, candidate: TapSet) -> list[dict]:
    """Stages one side of a pair did not capture, grouped by stage family (``text.generate.*``), with why.

    ``why`` names the capability the runtime lacks when it declares one (e.g. it does not decode), and
    ``declared`` says so: only those are excused from the coverage rule (``judge.coverage``)."""
    groups: dict[tuple[str, str], list[str]] = {}
    out = []
    for row in rows:
        if row.status == "missing":
            side = "reference" if row.note.endswith("reference") else "candidate"
            tapset = reference if side == "reference" else candidate
            why = (tapset.meta.get("declared_absent") or {}).get(row.stage)
            if why:  # the runtime said why it wrote no value it could compare (e.g. a layout it cannot decide)
                out.append(
                    {
                        "side": side,
                        "runtime": tapset.label,
                        "stages": [row.stage],
                        "pattern": row.stage,
                        "why": str(why),
                        "declared": True,
                    }
                )
                continue
            groups.setdefault((side, _group(row.stage)), []).append(row.stage)
    for (side, prefix), stages in groups.items():
        tapset = reference if side == "reference" else candidate
        why, declared = _why_absent(tapset, prefix)
        out.append(
            {
                "side": side,
                "runtime": tapset.label,
                "stages": stages,
                "pattern": stages[0] if len(stages) == 1 else f"{prefix}.*",
                "why": why,
                "declared": declared,
            }
        )
    return out


#: the stage groups only decoding writes (greedy, teacher-forced, the cache, the decoder's M-RoPE offset)
DECODED = ("text.generate", "text.forced", "text.cache", "text.rope_delta")


def _group(stage_id: str) -> str:
    """The group a missing stage is said under: its id less the last part, or a decode stage's own id (the
    decoder's M-RoPE offset: not the prompt's stages under ``text``)."""
    return stage_id if stage_id in DECODED else stage_id.rsplit(".", 1)[0]


def _why_absent(tapset: TapSet, prefix: str) -> tuple[str, bool]:
    """Why a runtime has no stages under ``prefix``, and whether that is a capability its runtime declares it
    lacks (else it is said plainly, and is a gap in the capture)."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.errors import DriftscopeError

    name = str(tapset.meta.get("runtime") or tapset.label)
    try:
        runtime = get_runtime(name)
    except DriftscopeError:
        runtime = None
    if prefix.startswith(DECODED):  # greedy and teacher-forced decoding
        if (tapset.meta.get("options") or {}).get("decode") is False:
            return f"{name} does not decode (options.decode: false)", True
        if runtime is not None and not _decodes(runtime, str(tapset.meta.get("family") or "")):
            return f"{name} does not decode", True
    return f"{tapset.label} did not capture them", False


def _decodes(runtime, family: str) -> bool:
    """Whether ``runtime`` declares greedy decoding for ``family`` (its general answer when the family is not
    known)."""
    from driftscope.errors import DriftscopeError

    try:
        return runtime.decodes_with(family)
    except DriftscopeError:
        return runtime.decodes


def _divergence_record(row: ComparisonRow) -> dict:
    """The first divergent stage of a pair and the element to look at: the first non-finite one, else the
    failing element furthest over its own tolerance (not the largest |difference|, which may pass)."""
    nonfinite, worst = row.first_nonfinite, row.worst_failing
    where = nonfinite or worst
    return {
        "stage": row.stage,
        "status": row.status,
        "failures": row.failures,
        "elements": row.elements,
        "max_abs": row.max_abs,
        "max_coords": where["coords"] if where else row.max_coords,
        "reference_value": where["reference"] if where else row.max_reference_value,
        "candidate_value": where["candidate"] if where else row.max_candidate_value,
        "tolerance": None if nonfinite or not worst else worst["tolerance"],
        "excess": None if nonfinite or not worst else worst["excess"],
        "atol_bound_failures": row.atol_bound_failures,
        "nonfinite_mismatch": row.nonfinite_mismatch,
        "note": row.note,
    }


def _divergence_reason(row: ComparisonRow) -> str:
    if row.first_nonfinite:
        where = row.first_nonfinite
        return (
            f"{row.nonfinite_mismatch} non-finite value(s) the other side lacks; first at {where['coords']}: "
            f"reference {where['reference']}, candidate {where['candidate']}"
        )
    if row.status in ("shape_mismatch", "layout_mismatch"):
        return f"{row.status.replace('_', ' ')}: {row.note}"  # no element was compared: say why, not a count
    return f"{row.failures}/{row.elements} elements over tolerance"
