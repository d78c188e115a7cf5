"""What a pair's narrowing and replay conclude, in one sentence with its evidence.

- **introduced**: a stage's operator, fed the reference's own input, already breaks the contract: that operator
  introduces the error. Every site is said (``sites``): each finest stage the replay labels introduced (a stage
  none of whose introduced pieces is finer), with its own operator and evidence, in execution order.
- **accumulation**: every op-local replay passes while accumulated stages fail: no operator introduces the error;
  it accumulates from the drift's onset, amplified where a stage multiplies the incoming error (the chain).
- **data**: the first divergence is a data stage (inputs, index math): there is no operator to replay.
- **unreplayed**: the first divergence is a stage nothing replays (no module of the candidate computes it alone, or
  the two sides' arrays differ in shape), and every stage before it agrees: what computes it there introduces it.
  Also when the error first rises above round-off, before the first divergence, at a stage nothing replays (a
  module's captured input: a merge or a scale in the model's own code) while every stage before that agrees: it
  enters there (``stage``), though the contract breaks later.
- **decode**: the prefill agrees and decoding first differs (``judge.decode_site``): the step, then the decoder
  layer and position whose KV cache breaks, or the position stage (``text.rope_delta``).
- **agreement**: nothing diverges; **not replayed**: something diverges but no replay says why.
"""

from __future__ import annotations

from driftscope.judge.rows import ComparisonRow, first_divergence
from driftscope.taps.stages import StagePlan

from .drilldown import DRIFT_FLOOR, Drilldown

SHOWN_AMPLIFIERS = 3  # the sentence names the strongest few; the record keeps the whole chain


def _onset(rows: list[ComparisonRow], plan: StagePlan) -> str | None:
    """The first stage on the activation path whose accumulated relative error is above round-off."""
    for row in rows:
        stage = plan[row.stage] if row.stage in plan else None
        if row.integer or (stage is not None and (stage.side or stage.data)) or row.status not in ("pass", "fail"):
            continue
        if row.relative_rms > DRIFT_FLOOR:
            return row.stage
    return None


def introduced_sites(drill: Drilldown) -> list[dict]:
    """Each finest stage the replay labels introduced (none of its introduced pieces finer), in execution order:
    ``{"stage", "op_local_failures", "op_local_relative_rms", "within"}`` (``within``: the coarser introduced
    stages around it, e.g. its block replayed whole)."""
    introduced = [label for label in drill.labels if label["label"] == "introduced"]
    names = [label["stage"] for label in introduced]
    sites = []
    for label in introduced:
        stage = label["stage"]
        if any(other.startswith(stage + ".") for other in names):
            continue  # a piece of it introduces the error: that piece is the site
        sites.append(
            {
                "stage": stage,
                "op_local_failures": label["op_local_failures"],
                "op_local_relative_rms": label["op_local_relative_rms"],
                "within": [other for other in names if stage.startswith(other + ".")],
            }
        )
    return sites


def _evidence(site: dict) -> str:
    return f"{site['op_local_failures']} elements over tolerance, relative RMS {site['op_local_relative_rms']:.3g}"


def _times(factor: float | None) -> str:
    return "x?" if factor is None else f"x{factor:.3g}"


def _between(stage: str, labels: dict[str, dict], plan: StagePlan) -> dict:
    """When every replayed piece of ``stage`` is clean, the error lies between them: what computes there without
    a stage of its own (a plan read from the models says which of the reference's modules have no partner)."""
    pieces = [label for name, label in labels.items() if name.startswith(f"{stage}.")]
    if not pieces or any(label["label"] == "introduced" for label in pieces):
        return {}
    read = plan.meta.get("generic") or {}
    path = ((read.get("stages") or {}).get(stage) or {}).get("torch")
    unaligned = sorted(
        p for p in (read.get("unaligned") or {}).get("transformers", {}) if path and p.startswith(f"{path}.")
    )
    text = f"; each of its {len(pieces)} replayed pieces is clean, so what differs is computed between them"
    if unaligned:
        text += f" (the reference's {', '.join(unaligned)}, with no module of the candidate at its place)"
    return {"text": text, "unaligned": unaligned}


def _unreplayed(first: ComparisonRow, rows: list[ComparisonRow], plan: StagePlan, labels: dict) -> dict:
    """The first divergence, when no replay reaches it and every model stage compared before it agrees without
    drift: the stage that agrees last, and the sentence saying the error comes from what computes the divergent stage
    after it."""
    if first.stage in labels or first.stage not in plan:
        return {}
    before = [
        row
        for row in rows
        if row.stage in plan
        and plan.position(row.stage) < plan.position(first.stage)
        and not (row.integer or plan[row.stage].data)
        and row.status in ("pass", "fail")
    ]
    if not before or _onset(before, plan) is not None or any(row.status != "pass" for row in before):
        return {}
    agrees = before[-1].stage
    if first.status == "shape_mismatch":
        said = (
            f"{first.stage} differs in shape (reference {first.reference_shape}, candidate {first.candidate_shape}) "
            f"while every stage before it agrees ({agrees} the last): what the candidate computes between them makes "
            "another array there"
        )
    else:
        said = (
            f"{first.stage} differs while every stage before it agrees ({agrees} the last), and the candidate has no "
            f"module computing it alone to replay: what computes it from {agrees} introduces the error"
        )
    return {"agrees": agrees, "text": said}


def _entry_point(rows: list[ComparisonRow], first: ComparisonRow, labels: dict, plan: StagePlan) -> dict:
    """The stage before the first divergence where the error first rises above round-off, when nothing replays it
    (no replay label, not data: a module's captured input, made by the model's own code between operators) and every
    stage before it agrees; empty when an operator's output drifts first, or nothing drifts before the divergence."""
    for row in rows:
        if row.stage == first.stage:
            return {}
        stage = plan[row.stage] if row.stage in plan else None
        if row.integer or (stage is not None and stage.data) or row.status not in ("pass", "fail"):
            continue
        if row.relative_rms > DRIFT_FLOOR:
            if row.stage in labels:
                return {}
            return {
                "stage": row.stage,
                "text": f"no operator introduces the error: it enters at {row.stage} (relative RMS "
                f"{row.relative_rms:.3g}), which nothing replays (the model's own code between operators: a merge, "
                f"a scale) and which stages that agree feed; it first breaks the contract at {first.stage}",
            }
    return {}


def conclude(drill: Drilldown | None, rows: list[ComparisonRow], plan: StagePlan, decode: dict | None = None) -> dict:
    """The pair's conclusion: ``kind``, the stages it rests on, and ``text`` (one sentence). ``decode``: where a
    decode-only defect starts (``judge.decode_site``), when the first divergence is a decode stage."""
    first = first_divergence(rows)
    if first is None:
        return {"kind": "agreement", "text": "every compared stage is within the contract"}
    where = {"first_divergence": first.stage}
    if decode is not None:
        keep = ("kind", "step", "layer", "position", "head", "stage")
        return {
            **where,
            **{k: v for k, v in decode.items() if k in keep},
            "site": decode["kind"],
            "kind": "decode",
            "text": decode["text"],
        }
    if first.stage in plan and plan[first.stage].data:
        return {
            "kind": "data",
            **where,
            "text": f"{first.stage} differs and is data (inputs or index math, compared exactly): "
            "no operator of the model computes it, so there is nothing to replay",
        }
    if drill is None:
        return {
            "kind": "not replayed",
            **where,
            "text": f"first divergence at {first.stage}; the candidate was not replayed on the reference's inputs, "
            "so whether an operator introduces it is not known",
        }
    labels = {label["stage"]: label for label in drill.labels}
    sites = introduced_sites(drill)
    if sites:
        first_site, others = sites[0], sites[1:]
        between = _between(first_site["stage"], labels, plan)
        text = (
            f"{first_site['stage']} introduces the error: its operator fed the reference's own input already fails "
            f"({_evidence(first_site)})" + between.get("text", "")
        )
        text += "".join(
            f"; {site['stage']} introduces error too ({_evidence(site)})"
            + _between(site["stage"], labels, plan).get("text", "")
            for site in others
        )
        return {
            "kind": "introduced",
            **where,
            "stage": first_site["stage"],
            "sites": sites,
            "text": text,
            **({"between": between["unaligned"]} if between else {}),
        }
    unreplayed = _entry_point(rows, first, labels, plan) or _unreplayed(first, rows, plan, labels)
    if unreplayed:
        return {"kind": "unreplayed", **where, "stage": first.stage, **unreplayed}
    stop = plan.position(first.stage) if first.stage in plan else len(plan)
    chain = [
        {"stage": label["stage"], "factor": label["amplification"]}
        for label in drill.labels
        if label["label"] == "amplified" and (label["stage"] not in plan or plan.position(label["stage"]) <= stop)
    ]
    onset = _onset(rows, plan)
    text = f"no operator introduces the error; it accumulates from {onset or first.stage} on"
    if chain:
        strongest = sorted(chain, key=lambda link: -(link["factor"] or 0.0))[:SHOWN_AMPLIFIERS]
        shown = [link for link in chain if link in strongest]
        text += " and is amplified by " + ", ".join(f"{link['stage']} ({_times(link['factor'])})" for link in shown)
    text += f"; it first breaks the contract at {first.stage}"
    return {"kind": "accumulation", **where, "onset": onset, "amplified": chain, "text": text}
