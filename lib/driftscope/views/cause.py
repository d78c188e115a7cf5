"""The suspected cause of each failing pair, for notebook 01's headline table (issue 34 item 1): what the replay
concluded, the operator(s) that introduce the error grouped by operator (the same operator in many blocks is one
entry), and the family's ready patch for each, where one matches."""

from __future__ import annotations

import re

from driftscope.run.report import Report

SHOWN_OPERATORS = 3  # the cell names the first few introducing operators; notebook 02 lists every one
COUNTED = ("block", "layer", "crop", "image", "expert")  # "blocks 0-3"; anything else: "at 18, 24"
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")  # a block's (or a layer's, an output's) number inside a stage id


def operator_of(stage: str) -> tuple[str, tuple[int, ...]]:
    """``("vision.block.*.mlp.act", (17,))`` for ``vision.block.17.mlp.act``: the operator and where it sits."""
    return _INDEX.sub(".*", stage), tuple(int(n) for n in _INDEX.findall(stage))


def _own_patch(report: Report, key: str) -> str | None:
    """The patch the candidate already runs (its ``callable`` when given with arguments), or None."""
    patch = (report.runtime_spec(key) or {}).get("patch")
    return patch.get("callable") if isinstance(patch, dict) else patch


def _runtime(report: Report, key: str) -> str | None:
    spec = report.runtime_spec(key) or {}
    return spec.get("runtime") or (key.split(":", 1)[0] if ":" in key else None)


def _spans(numbers: list[int]) -> str:
    """``"0-3, 7"`` for [0, 1, 2, 3, 7]."""
    spans, start = [], None
    for index, number in enumerate(numbers):
        if start is None:
            start = number
        if index + 1 == len(numbers) or numbers[index + 1] != number + 1:
            spans.append(str(start) if start == number else f"{start}-{number}")
            start = None
    return ", ".join(spans)


def _where(operator: str, stages: list[str], indices: list[tuple[int, ...]]) -> str:
    """Where an operator's stages sit, in words: ``"blocks 0-3, 7"``, ``"at 18, 24"``, or the one stage's id."""
    first = sorted({at[0] for at in indices if at})
    word = operator.split(".*", 1)[0].rsplit(".", 1)[-1]  # "block" in vision.block.*.mlp.act
    spans = _spans(first)
    where = f"{word}s {spans}" if word in COUNTED else (f"at {spans}" if first else f"{len(stages)} stages")
    return stages[0] if len(stages) == 1 else where


def _site_groups(sites: list[dict]) -> list[dict]:
    """The conclusion's sites grouped by operator, each group with the coarser stages around its own sites
    (``within``: e.g. its blocks replayed whole), never another operator's."""
    groups: dict[str, dict] = {}
    for site in sites:
        operator, indices = operator_of(site["stage"])
        group = groups.setdefault(operator, {"operator": operator, "stages": [], "indices": [], "outer": []})
        group["stages"].append(site["stage"])
        group["indices"].append(indices)
        group["outer"] += [outer for outer in site.get("within") or [] if outer not in group["outer"]]
    for operator in list(groups):  # whole blocks whose pieces were not captured, around an operator that was:
        inner = next((g for name, g in groups.items() if name.startswith(operator + ".")), None)
        if inner is not None:  # one answer: that operator, its error seen in those blocks too
            inner["outer"] += [stage for stage in groups.pop(operator)["stages"] if stage not in inner["outer"]]
    for group in groups.values():
        outer = group.pop("outer")
        within = [operator_of(stage) for stage in outer]
        group["within"] = _where(within[0][0], outer, [at for _, at in within]) if outer else ""
        group["within_count"] = len(outer)
    return list(groups.values())


def introduced_groups(report: Report, key: str) -> list[dict]:
    """Every site the pair's replay labels *introduced* (the conclusion's ``sites``: the finest introduced
    stages, else every introduced stage), grouped by operator in execution order: ``{"operator", "stages",
    "where", "patches", "within"}`` (``where``: e.g. ``"blocks 0-24"``; ``within``: the coarser stages around them
    that introduce error too; ``patches``: the family's ready patches for it, less the one the candidate runs)."""
    labels = ((report.data.get("replay") or {}).get(key) or {}).get("labels") or []
    stages = [label["stage"] for label in labels if label.get("label") == "introduced"]
    conclusion = report.conclusion(key)
    sites = conclusion.get("sites") or []
    if sites:
        return _with_patches(report, key, conclusion, _site_groups(sites))
    if not stages and conclusion.get("kind") == "introduced":
        stages = [conclusion["stage"]]
    groups: dict[str, dict] = {}
    for stage in stages:
        operator, indices = operator_of(stage)
        groups.setdefault(operator, {"operator": operator, "stages": [], "indices": [], "within": ""})
        groups[operator]["stages"].append(stage)
        groups[operator]["indices"].append(indices)
    return _nest(_with_patches(report, key, conclusion, list(groups.values())))


def _with_patches(report: Report, key: str, conclusion: dict, groups: list[dict]) -> list[dict]:
    """Each group with where it sits and the family's ready patches for its operator (less the candidate's own)."""
    family, runtime, own = report.data.get("family"), _runtime(report, key), _own_patch(report, key)
    shown = []
    for group in groups:
        patches = []
        if family and runtime:
            from driftscope.families import get_family

            model_type = (report.data.get("plan_meta") or {}).get("model_type")
            found = get_family(family).ready_patches(group["stages"][0], runtime, model_type, report.activations(key))
            patches = [p for p in found if p != own]
        if group["stages"][0] == conclusion.get("stage"):
            patches = list(dict.fromkeys([*(conclusion.get("ready_patches") or []), *patches]))
        where = _where(group["operator"], group["stages"], group.pop("indices"))
        shown.append({**group, "where": where, "patches": patches})
    return shown


def _nest(groups: list[dict]) -> list[dict]:
    """A group that contains another (whole blocks ``vision.block.*`` around ``vision.block.*.mlp.act``) is said
    with the operator inside it, as where else its error shows (``within``), not as a second cause."""
    inner = {}
    for outer in groups:
        found = next((g for g in groups if g is not outer and g["operator"].startswith(outer["operator"] + ".")), None)
        if found is not None:
            inner[id(outer)] = found
    for outer_id, found in inner.items():
        outer = next(g for g in groups if id(g) == outer_id)
        found["within"], found["within_count"] = outer["where"], len(outer["stages"])
        found["patches"] = list(dict.fromkeys([*found["patches"], *outer["patches"]]))
    return [g for g in groups if id(g) not in inner]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def cause_text(report: Report, key: str) -> str:
    """The pair's suspected cause in a few words: where its error is introduced (each operator once), or that it
    accumulates and from where, or that its first divergence is data; "" for a pair that passes."""
    conclusion = report.conclusion(key)
    kind = conclusion.get("kind")
    if kind in (None, "agreement"):
        return ""
    if kind == "introduced":
        groups = introduced_groups(report, key)
        parts = []
        for group in groups[:SHOWN_OPERATORS]:
            notes = [] if len(group["stages"]) == 1 else [group["where"]]
            verb = "introduces" if group.get("within_count") == 1 else "introduce"
            notes += [f"replayed whole, {group['within']} {verb} error too"] if group["within"] else []
            name = group["stages"][0] if len(group["stages"]) == 1 else group["operator"]
            parts.append(name + (f" ({'; '.join(notes)})" if notes else ""))
        more = len(groups) - SHOWN_OPERATORS
        parts += [f"and {_plural(more, 'more operator')} (notebook 02)"] if more > 0 else []
        head = "introduced at " if len(groups) == 1 else f"introduced by {_plural(len(groups), 'operator')}: "
        return head + "; ".join(parts)
    if kind == "accumulation":
        said = f"accumulated drift from {conclusion.get('onset') or conclusion.get('first_divergence')}"
        chain = conclusion.get("amplified") or []
        if chain:
            strongest = max(chain, key=lambda link: link.get("factor") or 0.0)
            factor = strongest.get("factor")
            said += f", amplified most at {strongest['stage']}" + (f" (x{factor:.3g})" if factor else "")
        return said + "; no single operator introduces it"
    if kind == "data":
        return f"{conclusion.get('first_divergence')} is data (inputs or index math): no operator to replay"
    if kind == "not replayed":
        return "not replayed: add the pair to replay to find the operator"
    return str(conclusion.get("text", ""))


def patch_text(report: Report, key: str) -> str:
    """The ready patch(es) for the pair's introduced operators, each once, and where to try the first; "none
    declared" for a failing pair whose introduced operators have none; for a first divergence at a data stage,
    the patches declared for it; "" otherwise."""
    conclusion = report.conclusion(key)
    trial = (report.data.get("patch_trials") or {}).get(key) or {}
    if trial.get("status") == "tried":  # the run tried it: say what it found there
        where = f"block {trial['block']}" if trial.get("block") is not None else ", ".join(trial.get("stages") or [])
        return (
            f"{trial['patch']} (tried on {where} by the run: {'closes it' if trial.get('closes') else 'still fails'})"
        )
    if conclusion.get("kind") in ("data", "unreplayed"):  # a stage no replay reaches: the pair run again with it
        patches = conclusion.get("ready_patches") or []
        return f"{', '.join(patches)} (run the pair again with it)" if patches else ""
    if conclusion.get("kind") != "introduced":
        return ""
    groups = introduced_groups(report, key)
    patches = list(dict.fromkeys(p for g in groups for p in g["patches"]))
    if not patches:
        return "none declared"
    closes_all = [p for p in patches if len(groups) > 1 and all(p in g["patches"] for g in groups)]
    if closes_all:  # one patch closes every introducing operator: that one (the others close one each)
        patches = closes_all[:1]
    first = next(g for g in groups if g["patches"])
    stage = first["stages"][0]
    block = report.plan[stage].block if stage in report.plan else None
    where = f"try on block {block} in notebook 02" if block is not None else "run the pair again with it"
    return f"{', '.join(patches)} ({where})"
