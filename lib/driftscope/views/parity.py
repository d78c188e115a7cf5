"""The top of notebook 01, what a reviewer reads in ten seconds: the verdict, each runtime pair's first
divergence (the worst failing element with both values and its own tolerance, and whether atol decided),
what was not compared and why, and the error curves against the real per-stage tolerance."""

from __future__ import annotations

from pathlib import Path

from driftscope.capture.runtime_checks import COULD_NOT_RUN
from driftscope.core.markup import code, format_number, listed, text
from driftscope.judge.rows import share_of_tolerance
from driftscope.run.report import Report

from .curves import error_curves
from .notebook import coordinates, family_text, table


def atol_note(first: dict, atol: float, rtol: float) -> str:
    """Whether atol alone decided a first divergence's failures (each at a reference so small that rtol·|e|
    adds at most atol): ``"all 5 (|e| ≤ 1)"`` (1 = atol/rtol), ``"3 of 5 (|e| ≤ 1)"``, or ``""``."""
    failures, bound = int(first.get("failures") or 0), int(first.get("atol_bound_failures") or 0)
    if not failures or not bound or first.get("nonfinite_mismatch"):
        return ""
    share = ("yes" if failures == 1 else f"all {failures}") if bound == failures else f"{bound} of {failures}"
    return f"{share} (|e| ≤ {atol / rtol:.3g})" if rtol else f"{share} (rtol 0)"


def _row(rows: list, key: str, stage: str | None):
    return next((r for r in rows if (r.pair or r.candidate) == key and r.stage == stage), None)


def not_compared_lines(report: Report) -> list[str]:
    """One Markdown line per reason and the pairs it holds for (never part of the verdict), e.g.
    "iree does not decode: ``text.generate.*``, ``text.forced.*`` not compared for ``iree:f32``"."""
    by_pattern: dict[tuple[str, str], list[str]] = {}
    for key, groups in (report.data.get("not_compared") or {}).items():
        for group in groups:
            by_pattern.setdefault((group["why"], group["pattern"]), []).append(key)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # one line for the patterns of one reason and pairs
    for (why, pattern), keys in by_pattern.items():
        grouped.setdefault((why, tuple(keys)), []).append(pattern)
    return [
        f"{text(why)}: {', '.join(code(p) for p in patterns)} not compared for "
        f"{', '.join(code(report.pair_title(k)) for k in keys)} (not part of the verdict)"
        for (why, keys), patterns in grouped.items()
    ]


def coverage_line(report: Report) -> str | None:
    """One Markdown line on what the pairs compared: every stage either side captured, or where each fell short
    (``judge.coverage``: a pair that falls short fails). None for a report from before coverage was recorded."""
    coverage = report.data.get("coverage")
    if not coverage:
        return None
    short = {key: entry for key, entry in coverage.items() if not entry.get("complete", True)}
    if not short:
        counts = sorted({(entry["compared"], entry["model_stages"]) for entry in coverage.values()})
        each = ", ".join(f"{compared} ({model} model stages)" for compared, model in counts)
        judged = min((entry.get("judged_fraction", 1.0) for entry in coverage.values()), default=1.0)
        some = f"; {judged:.2%} of the elements judged (the rest non-finite on both sides)" if judged < 1 else ""
        return f"Coverage: every pair compared every stage either side captured: {text(each)} per pair{some}"
    parts = []
    for key, entry in short.items():
        gaps = [f"{len(stages)} missing on the {side}" for side, stages in entry.get("missing", {}).items()]
        gaps += [f"{len(entry['not_judged'])} not judged"] if entry.get("not_judged") else []
        gaps += ["no model stage"] if entry["compared"] and not entry["model_stages"] else []
        gaps += (
            [f"{entry['judged_fraction']:.2%} of its elements judged"] if entry.get("judged_fraction", 1) < 1 else []
        )
        counted = f"compared {entry['compared']} of {entry['stages']}"
        parts.append(f"{code(report.pair_title(key))} {counted} ({text(', '.join(gaps))})")
    return "**Coverage falls short** (a gate needs coverage): " + "; ".join(parts)


def verdict_markdown(report: Report) -> str:
    """The verdict in one paragraph, with the run, commit, reference and contract; then the reasons that are not
    a first divergence (failed checks, warnings, a runtime that could not run) and what was not compared."""
    data = report.data
    verdict = data.get("verdict") or {}
    contract = data.get("contract") or {}
    tolerance = contract.get("default") or {}
    yardsticks = verdict.get("yardsticks") or {}  # measured and shown, never counted
    per_pair = {key: status for key, status in (verdict.get("per_candidate") or {}).items() if key not in yardsticks}
    failing = [key for key, status in per_pair.items() if status != "pass"]
    unrun = sum(status == COULD_NOT_RUN for status in per_pair.values())
    measured = "; ".join(
        f"{code(report.pair_title(key))} is a yardstick ({text(why)}), measured and shown, not counted"
        for key, why in yardsticks.items()
    )
    head = (
        f"**Verdict: {text(str(verdict.get('status', 'unknown')).upper())}**: {len(failing) - unrun} of "
        f"{len(per_pair)} runtime pairs fail{f', {unrun} could not run' if unrun else ''}"
        f"{f' ({measured})' if measured else ''}. "
        f"Run {code(data.get('name'))}, commit {code(data.get('commit'))}, reference "
        f"{code(data.get('reference'))}, contract {code(contract.get('name'))} (atol {text(tolerance.get('atol'))}, "
        f"rtol {text(tolerance.get('rtol'))}: an element fails where |a - e| > atol + rtol·|e|)."
    )
    if report.status != "complete":
        return head + f"\n\nRun **{text(report.status)}**: {text(report.stopped())}"
    from .finding import banners

    lines = [head, "", *banners(report)]  # each failing pair's mechanism in words, its ready patch as the run tried it
    # each failing pair's suspected cause and ready patch are in the table below too (divergence_frame)
    others = [r for r in verdict.get("reasons", []) if ": first divergence at " not in r]
    lines += [f"- {text(reason)}" for reason in others]
    lines += [f"- **warning**: {text(warning)}" for warning in data.get("warnings") or []]
    lines += [f"- {line}" for line in not_compared_lines(report)]
    coverage = coverage_line(report)
    lines += [f"- {coverage}"] if coverage else []
    power = data.get("power")
    if power:
        blind = [code(m["mutation"]) for m in power["mutations"] if not m["detected"]]
        detected = len(power["mutations"]) - len(blind)
        lines.append(
            f"- Fixture power ({code(power['runtime'])} with each mutation, gate {text(power.get('gate'))}): detects "
            f"{detected} of {len(power['mutations'])}; blind to {', '.join(blind) or 'none'} (notebook 04 says why)"
        )
    return "\n".join(lines)


def _closest(rows: list, key: str) -> str:
    """The stage of a pair whose worst element comes closest to (or goes furthest past) its tolerance."""
    rows = [r for r in rows if (r.pair or r.candidate) == key and r.status in ("pass", "fail")]
    rows = [r for r in rows if not r.integer]
    if not rows:
        return ""
    worst = max(rows, key=share_of_tolerance)
    return f"{share_of_tolerance(worst):.2g} at {worst.stage}"


def _past(first: dict) -> str:
    """The worst failing element's tolerance and how far past it: ``"0.08135 (1.08x)"``."""
    if first.get("nonfinite_mismatch"):
        return "non-finite"
    tolerance = first.get("tolerance")
    excess = f" ({first['excess']:.3g}x)" if first.get("excess") else ""
    return ("" if tolerance is None else format_number(tolerance, 4)) + excess


#: The headline table's columns, in order.
DIVERGENCE_COLUMNS = (
    "runtime pair",
    "verdict",
    "first divergence",
    "failures",
    "worst failing element",
    "expected",
    "actual",
    "its tolerance (past it)",
    "atol-bound",
    "most tolerance used",
    "suspected cause",
    "ready patch",
)
#: The headline table's columns that wrap (long words and sentences): the table fits the page.
HEADLINE_WRAP = (
    "runtime pair",
    "failures",
    "its tolerance (past it)",
    "atol-bound",
    "most tolerance used",
    "suspected cause",
)


def divergence_frame(report: Report):
    """One row per runtime pair: its verdict, its first divergent stage and the worst failing element there
    (coordinates, expected and actual value, that element's tolerance and how far past it), whether atol
    alone decided, the stage closest to its tolerance, the suspected cause (the replay's conclusion, each
    introducing operator once) and the family's ready patch for it."""
    import pandas as pd

    from .cause import cause_text, patch_text

    data = report.data
    per_pair = (data.get("verdict") or {}).get("per_candidate") or {}
    rows = report.rows  # parsed once
    records = []
    for key in report.pair_keys():
        first = (data.get("first_divergence") or {}).get(key) or {}
        row = _row(rows, key, first.get("stage"))
        yardstick = key in ((data.get("verdict") or {}).get("yardsticks") or {})
        records.append(
            {
                "runtime pair": report.pair_title(key) + (" (yardstick)" if yardstick else ""),
                "verdict": per_pair.get(key, "") + (" (yardstick, not counted)" if yardstick else ""),
                "first divergence": first.get("stage", "none"),
                "failures": f"{first['failures']} / {first['elements']}" if first else "0",
                "worst failing element": "" if not first else coordinates(first.get("max_coords")),
                "expected": "" if not first else format_number(first.get("reference_value"), 5),
                "actual": "" if not first else format_number(first.get("candidate_value"), 5),
                "its tolerance (past it)": _past(first) if first else "",
                "atol-bound": atol_note(first, row.atol, row.rtol) if first and row else "",
                "most tolerance used": _closest(rows, key),
                "suspected cause": cause_text(report, key),
                "ready patch": patch_text(report, key),
            }
        )
    frame = pd.DataFrame(records, columns=DIVERGENCE_COLUMNS)  # no pair at all (no candidate loaded): no rows
    failing = frame["verdict"].isin(("fail", COULD_NOT_RUN))  # failing pairs first, then yardsticks, then the rest
    yardstick = frame["verdict"].str.endswith("(yardstick, not counted)")
    rest = ~failing & ~yardstick
    return pd.concat([frame[failing], frame[yardstick], frame[rest]]).reset_index(drop=True)


def headline(report: Report):
    """Display the verdict, the first-divergence table and the tolerance curve (the first screen of 01)."""
    from IPython.display import Markdown, display

    display(Markdown(verdict_markdown(report)))  # with each failing pair's finding
    if report.status != "complete":
        return
    cached = reference_cache_line(report)
    if cached:
        display(Markdown(cached))
    display(
        table(divergence_frame(report), highlight="verdict", wrap=HEADLINE_WRAP, fit=True, anywhere=("ready patch",))
    )
    if report.rows:
        display(error_curves(report, metrics=("tolerance_used",), height=1.2, title=False))  # above the fold


def reference_cache_line(report: Report) -> str | None:
    """One line saying the reference's taps came from the reference cache (``run.refcache``), and whose run stored
    them; None when they were captured by this run."""
    cached = report.data.get("reference_cache") or {}
    if cached.get("status") != "hit":
        return None
    stored = cached.get("stored") or {}
    source = f" (stored by commit {code(stored['commit'])})" if stored.get("commit") else ""
    power = (report.data.get("power") or {}).get("reference_cache") or {}
    mutations = f"; so were {power['hit']} of the {len(power['captures'])} mutated captures" if power.get("hit") else ""
    label = cached.get("label") or report.data.get("reference")
    return (
        f"The reference {code(label)}'s taps were reused from the reference cache {code(cached['entry'])}{source}, "
        f"not captured again{mutations}."
    )


def _element(row) -> tuple[object, float | None, float | None]:
    """(coordinates, expected, actual) of a row's element to look at: the worst failing one where it fails,
    else the largest difference."""
    worst = row.first_nonfinite or row.worst_failing
    if worst:
        return worst["coords"], worst["reference"], worst["candidate"]
    return row.max_coords, row.max_reference_value, row.max_candidate_value


def exact_note(row) -> str:
    """What an exact stage (integers, a mask, indices: no tolerance) says: how many of its entries differ."""
    return f"exact stage: {row.failures:,} of {row.elements:,} entries differ" if row.failures else "exact stage: equal"


def stage_frame(report: Report):
    """The compact stage table: failing and first-divergent stages first, then block outputs and the plan's
    landmarks (and their parts), each pair in execution order; the pair in the first column. Stages nobody
    compared (not captured by one side) are left out: :func:`not_compared_lines` says which and why."""
    import pandas as pd

    from .plots import block_outputs, landmarks

    first = {key: (value or {}).get("stage") for key, value in (report.data.get("first_divergence") or {}).items()}
    marks, blocks = landmarks(report), block_outputs(report)
    order = {key: index for index, key in enumerate(report.pair_keys())}
    position = {stage["id"]: index for index, stage in enumerate(report.data.get("stage_plan", []))}
    chosen = []
    for row in report.rows:
        key = row.pair or row.candidate
        failing = row.failed or first.get(key) == row.stage
        landmark = row.stage in blocks or any(row.stage == m or row.stage.startswith(m + ".") for m in marks)
        if failing or (landmark and row.status == "pass"):
            chosen.append((0 if failing else 1, order.get(key, len(order)), position.get(row.stage, 0), row))
    records = []
    for *_, row in sorted(chosen, key=lambda item: item[:3]):
        coords, expected, actual = _element(row)
        exact = bool(row.integer)  # compared exactly: no tolerance, no RMS, no cosine to speak of
        records.append(
            {
                "runtime pair": report.pair_title(row.pair or row.candidate),
                "stage": row.stage,
                "status": row.status,
                "failures": row.failures,
                "elements": row.elements,
                "tolerance used": None if exact else share_of_tolerance(row),
                "max |a - e|": row.max_abs,
                "relative RMS": None if exact else row.relative_rms,
                "cosine": None if exact else row.cosine,
                "element (worst failing, else largest |a - e|)": coordinates(coords),
                "expected": expected,
                "actual": actual,
                "atol-bound failures": row.atol_bound_failures if row.failures and not exact else None,
                "note": "; ".join(filter(None, [exact_note(row) if exact else "", row.note])),
            }
        )
    return pd.DataFrame(records)


def inputs_frame(report: Report):
    """What every runtime received, one row per image: each per-image entry of the report's ``inputs`` (its
    size, the processor's resize and grid, its tokens, what was done to make it RGB), whatever the family."""
    import pandas as pd

    inputs = report.data.get("inputs") or {}
    images = inputs.get("images") or []
    per_image = {
        key: value
        for key, value in inputs.items()
        if key != "images" and isinstance(value, list) and len(value) == len(images)
    }

    def shown(value) -> str:
        """A size or a grid as ``14 x 14``, several as ``14 x 14, 14 x 14``; None as "none"."""
        if value is None:
            return "none"
        if isinstance(value, list) and any(isinstance(v, list) for v in value):
            return ", ".join(shown(v) for v in value)
        return " x ".join(map(str, value)) if isinstance(value, list) else str(value)

    return pd.DataFrame(
        [
            {"image": Path(str(path)).name, **{key.replace("_", " "): shown(v[i]) for key, v in per_image.items()}}
            for i, path in enumerate(images)
        ]
    )


def inputs_markdown(report: Report) -> str:
    """What the family draws over the images, the processor, the inputs digest every runtime's capture must
    match, and the prompt (when followed)."""
    inputs = report.data.get("inputs") or {}
    processor = dict(inputs.get("processor") or {})
    name = processor.pop("class", "the checkpoint's processor")
    settings = ", ".join(
        f"{text(k)} {text(listed(v, ' x ' if k.endswith('size') else ', '))}" for k, v in processor.items()
    )
    patches = inputs.get("patches")
    lines = [
        family_text(report, "inputs"),
        f"Processor {code(name)}"
        + (f" ({settings})" if settings else "")
        + (f"; {text(patches)} patches" if patches is not None else "")
        + f"; inputs digest {code(inputs.get('digest'))} (every capture must report the same).",
    ]
    prompt = inputs.get("text")
    if prompt:
        expect = prompt.get("expect") or []
        words = (
            f"expected words: {', '.join(code(w) for w in expect)}" if expect else "no expected words (`text.expect`)"
        )
        lines.append(
            f"Prompt ({text(prompt.get('tokens'))} tokens, {text(prompt.get('max_new_tokens'))} generated): "
            f"{code(prompt.get('prompt'))}; {words}"
        )
    return "\n\n".join(line for line in lines if line)
