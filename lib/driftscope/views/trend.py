"""Commit to commit: which stages got better or worse, new and vanished stages, moved first divergences."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from driftscope.core.numeric import checked_floor, checked_ratio
from driftscope.run.report import Report

from ..errors import ParameterError, ReportError


def resolve_commit_dir(out_root: Path, revision: str) -> Path:
    """``out_root/<commit>`` for a directory name, a unique prefix of one, or a git revision."""
    out_root = Path(out_root)
    if (out_root / revision).is_dir():
        return out_root / revision
    matches = [d for d in out_root.iterdir() if d.is_dir() and d.name.startswith(revision)] if out_root.exists() else []
    if len(matches) == 1:
        return matches[0]
    done = subprocess.run(["git", "rev-parse", "--short=12", revision], capture_output=True, text=True)
    if done.returncode == 0 and (out_root / done.stdout.strip()).is_dir():
        return out_root / done.stdout.strip()
    known = sorted(d.name for d in out_root.iterdir() if d.is_dir()) if out_root.exists() else []
    raise ParameterError(
        f"no runs for {revision!r} under {out_root}",
        f"run `driftscope batch ... --commit {revision}` first; commits with runs: {known}",
    )


def reports(commit_dir: Path, unreadable: dict[str, str] | None = None) -> dict[str, Report]:
    """The runs of one commit directory by name; reports that cannot be read go to ``unreadable`` (name -> why)."""
    found = {}
    for path in sorted(Path(commit_dir).glob("*/report.json")):
        try:
            report = Report.load(path)
        except ReportError as err:
            if unreadable is not None:
                unreadable[path.parent.name] = err.problem
            continue
        name = report.data.get("name") or path.parent.name
        if name in found and unreadable is not None:  # a copied run directory: which one is the run is not known
            unreadable[name] = (
                f"two run directories hold a run named {name!r}: {found[name].directory.name}, {path.parent.name}"
            )
        found[name] = report
    return found


def _metrics(report: Report) -> dict[tuple[str, str], float]:
    return {
        ((row.pair or row.candidate), row.stage): row.max_abs
        for row in report.rows
        if row.status in ("pass", "fail") and not row.integer
    }


def _tolerances(contract: dict | None) -> dict[str, dict]:
    """``{"default" | stage pattern: tolerance}`` of a report's contract."""
    contract = contract or {}
    found = {"default": contract.get("default") or {}}
    for rule in contract.get("stages") or []:
        found[rule.get("pattern")] = {k: v for k, v in rule.items() if k != "pattern"}
    return found


def contract_changes(a: Report, b: Report) -> list[dict]:
    """Tolerances that differ between two reports' contracts, each marked looser or stricter."""
    before, after = _tolerances(a.data.get("contract")), _tolerances(b.data.get("contract"))
    changes = []
    for scope in list(before) + [s for s in after if s not in before]:
        old, new = before.get(scope), after.get(scope)
        if old == new:
            continue
        direction = "added" if old is None else "removed" if new is None else "changed"
        if old is not None and new is not None:
            keys = ("atol", "rtol", "max_failure_fraction")
            looser = any(float(new.get(k, 0)) > float(old.get(k, 0)) for k in keys) or (
                new.get("skip") and not old.get("skip")
            )
            stricter = any(float(new.get(k, 0)) < float(old.get(k, 0)) for k in keys) or (
                old.get("skip") and not new.get("skip")
            )
            direction = "looser" if looser and not stricter else "stricter" if stricter and not looser else "changed"
        changes.append({"scope": scope, "change": direction, "before": old, "after": new})
    return changes


def parameter_changes(a: Report, b: Report) -> list[dict]:
    """Parameters (other than the description) that differ between two reports."""
    pa, pb = a.data.get("parameters") or {}, b.data.get("parameters") or {}
    keys = [k for k in list(pa) + [k for k in pb if k not in pa] if k != "description"]
    return [{"key": k, "before": pa.get(k), "after": pb.get(k)} for k in keys if pa.get(k) != pb.get(k)]


def _execution_order(a: Report, b: Report) -> dict[str, int]:
    order: dict[str, int] = {}
    for report in (b, a):
        for stage in report.data.get("stage_plan", []):
            order.setdefault(stage["id"], len(order))
    return order


def diff_reports(a: Report, b: Report, factor: float = 1.5, floor: float = 1e-6) -> dict:
    """Changed contract and parameters, then per pair and stage (execution order): better / worse / unchanged
    (beyond ``factor`` and ``floor``), new and vanished."""
    factor, floor = checked_ratio(factor, "factor (--factor)"), checked_floor(floor, "floor")
    ma, mb = _metrics(a), _metrics(b)
    order = _execution_order(a, b)
    pairs = {p: i for i, p in enumerate(dict.fromkeys(b.pair_keys() + a.pair_keys() + [k[0] for k in (*ma, *mb)]))}
    changes = []
    for key in sorted(set(ma) | set(mb), key=lambda k: (pairs[k[0]], order.get(k[1], len(order)), k[1])):
        pair, stage = key
        if key not in ma:
            changes.append({"pair": pair, "stage": stage, "change": "new", "before": None, "after": mb[key]})
            continue
        if key not in mb:
            changes.append({"pair": pair, "stage": stage, "change": "vanished", "before": ma[key], "after": None})
            continue
        before, after = ma[key], mb[key]
        if after > before * factor and after - before > floor:
            change = "worse"
        elif after < before / factor and before - after > floor:
            change = "better"
        else:
            change = "unchanged"
        changes.append({"pair": pair, "stage": stage, "change": change, "before": before, "after": after})
    fa, fb = a.data.get("first_divergence") or {}, b.data.get("first_divergence") or {}
    moved = []
    for pair in sorted(set(fa) | set(fb), key=lambda p: pairs.get(p, len(pairs))):
        sa = (fa.get(pair) or {}).get("stage")
        sb = (fb.get(pair) or {}).get("stage")
        if sa != sb:
            moved.append({"pair": pair, "before": sa, "after": sb})
    return {
        "verdict": {"before": a.verdict, "after": b.verdict},
        "status": {"before": a.status, "after": b.status},
        "contract": contract_changes(a, b),
        "parameters": parameter_changes(a, b),
        "first_divergence": moved,
        "stages": changes,
    }


def worse_stages(diff: dict) -> list[tuple[str, str, str]]:
    """(run, pair, stage) of every stage that got worse beyond the noise floor, for ``--fail-on worse``."""
    return [
        (name, change["pair"], change["stage"])
        for name, run in diff["runs"].items()
        for change in run.get("stages", [])
        if change["change"] == "worse"
    ]


def diff_commits(dir_a: Path, dir_b: Path, factor: float = 1.5, floor: float = 1e-6) -> dict:
    factor, floor = checked_ratio(factor, "factor (--factor)"), checked_floor(floor, "floor")
    bad_a: dict[str, str] = {}
    bad_b: dict[str, str] = {}
    ra, rb = reports(dir_a, bad_a), reports(dir_b, bad_b)
    out = {"before": Path(dir_a).name, "after": Path(dir_b).name, "runs": {}}
    for name, why in [*bad_a.items(), *bad_b.items()]:
        out["runs"][name] = {"unreadable": why}
    for name in sorted(set(ra) | set(rb)):
        if name in out["runs"]:
            continue
        if name not in ra or name not in rb:
            out["runs"][name] = {"only_in": Path(dir_b if name in rb else dir_a).name}
            continue
        out["runs"][name] = diff_reports(ra[name], rb[name], factor, floor)
    return out


def missing_evidence(diff: dict) -> list[str]:
    """What the later commit lacks that the earlier one judged: a run only in the earlier commit, a run that did not
    complete in the later one, a pair's stage compared before and not after (``vanished``). With ``--fail-on
    worse`` each is a failure of the comparison unless ``--allow-missing`` is given: no evidence is not a pass."""
    before, after = diff["before"], diff["after"]
    found = []
    for name, run in diff["runs"].items():
        status = (run.get("status") or {}).get("after", "complete")
        vanished = [c for c in run.get("stages", []) if c["change"] == "vanished"]
        if run.get("only_in") == before:
            found.append(f"{name}: no run in {after}")
        elif status != "complete":
            found.append(f"{name}: its run in {after} did not complete ({status})")
        elif vanished:
            first = vanished[0]
            found.append(
                f"{name}: {len(vanished)} stage(s) judged in {before} are missing in {after} "
                f"(e.g. {first['pair']} {first['stage']})"
            )
    return found


def diff_exit_code(diff: dict, fail_on: str | None = None, allow_missing: bool = False) -> int:
    """2: a report could not be read; with ``fail_on="worse"``, 1 when a run got worse (a verdict no longer
    passes, or a stage is worse beyond the noise floor: the CI gate) or, unless ``allow_missing``, when the later
    commit lacks evidence the earlier one had (:func:`missing_evidence`); else 0."""
    runs = diff["runs"].values()
    if any("unreadable" in run for run in runs):
        return 2
    if fail_on != "worse":
        return 0
    regressed = any(
        run.get("verdict", {}).get("before") == "pass" and run.get("verdict", {}).get("after") != "pass" for run in runs
    )
    missing = [] if allow_missing else missing_evidence(diff)
    return 1 if regressed or worse_stages(diff) or missing else 0


def format_diff(diff: dict) -> str:
    lines = [f"driftscope diff {diff['before']} -> {diff['after']}"]
    for name, run in diff["runs"].items():
        if "unreadable" in run:
            lines.append(f"\n{name}: unreadable ({run['unreadable']})")
            continue
        if "only_in" in run:
            lines.append(f"\n{name}: only in {run['only_in']}")
            continue
        status = run.get("status") or {}
        if status.get("after", "complete") != "complete":
            lines.append(f"\n{name}: did not complete in {diff['after']} ({status['after']})")
        changed = [c for c in run["stages"] if c["change"] != "unchanged"]
        lines.append(
            f"\n{name}: verdict {run['verdict']['before']} -> {run['verdict']['after']}; "
            f"{len(changed)} changed stage(s)"
        )
        for change in run.get("contract", []):
            lines.append(
                f"  CONTRACT {change['change']:8s} {change['scope']}: {_short(change['before'])} -> "
                f"{_short(change['after'])}"
            )
        if any(c["change"] != "stricter" for c in run.get("contract", [])):
            lines.append("  (verdicts under different contracts: `driftscope rejudge` both under one to compare them)")
        for change in run.get("parameters", []):
            lines.append(f"  PARAMETER {change['key']}: {_short(change['before'])} -> {_short(change['after'])}")
        for move in run["first_divergence"]:
            lines.append(f"  first divergence of {move['pair']}: {move['before']} -> {move['after']}")
        for change in changed:
            before = "-" if change["before"] is None else f"{change['before']:.3g}"
            after = "-" if change["after"] is None else f"{change['after']:.3g}"
            lines.append(f"  {change['change']:9s} {change['pair']:24s} {change['stage']:40s} {before} -> {after}")
    missing = missing_evidence(diff)
    if missing:
        lines.append("\nmissing in " + diff["after"] + " (a failure of `--fail-on worse` unless `--allow-missing`):")
        lines += [f"  MISSING {line}" for line in missing]
    return "\n".join(lines)


def _short(value, limit: int = 100) -> str:
    import json

    text = "-" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stage_commit_heatmap(out_root: Path, commits: list[str], run: str, pair: str | None = None) -> Figure:
    """log10 max_abs of one run's stages (rows) across commits (columns)."""
    columns, stage_order = [], []
    for commit in commits:
        report = reports(Path(out_root) / commit).get(run)
        metrics = {}
        if report is not None:
            chosen = pair or (report.pair_keys()[0] if report.pair_keys() else None)
            metrics = {stage: value for (p, stage), value in _metrics(report).items() if p == chosen}
            for stage in (s["id"] for s in report.data.get("stage_plan", [])):
                if stage in metrics and stage not in stage_order:
                    stage_order.append(stage)
        columns.append(metrics)
    values = np.array([[c.get(s, np.nan) if s in c else np.nan for c in columns] for s in stage_order], dtype=float)
    positive = values[np.isfinite(values) & (values > 0)]
    low = math.log10(positive.min()) if positive.size else 0.0
    high = math.log10(positive.max()) if positive.size else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):  # exactly equal: below the scale (white), not 1e-12
        grid = np.where(values > 0, np.log10(values), np.where(values == 0, low - 1.0, np.nan))
    colours = matplotlib.colormaps["viridis"].with_extremes(under="#ffffff", bad="#d9d9d9")
    figure = Figure(figsize=(1.2 * len(commits) + 4, 0.16 * max(len(stage_order), 10) + 1.5), layout="constrained")
    axis = figure.subplots()
    shown = axis.imshow(grid if grid.size else np.zeros((1, 1)), aspect="auto", cmap=colours, interpolation="nearest",
                        vmin=low, vmax=max(high, low + 1e-9))  # fmt: skip
    axis.set_xticks(range(len(commits)), commits, rotation=45, fontsize=8)
    axis.set_yticks(range(len(stage_order)), [s.replace("vision.", "") for s in stage_order], fontsize=6)
    axis.set_title(f"{run}: log10 max_abs per stage and commit" + (f" ({pair})" if pair else ""))
    exact = int((values == 0).sum())
    figure.colorbar(shown, ax=axis, label=f"log10 max_abs (white: exactly equal, {exact} cells; grey: not captured)")
    return figure
