"""Commit to commit: which stages got better or worse, new and vanished stages, moved first divergences."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..errors import ParameterError
from ..report import Report


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


def reports(commit_dir: Path) -> dict[str, Report]:
    found = {}
    for path in sorted(Path(commit_dir).glob("*/report.json")):
        report = Report.load(path)
        found[report.data.get("name") or path.parent.name] = report
    return found


def _metrics(report: Report) -> dict[tuple[str, str], float]:
    return {
        ((row.pair or row.candidate), row.stage): row.max_abs
        for row in report.rows
        if row.status in ("pass", "fail") and not row.integer
    }


def diff_reports(a: Report, b: Report, factor: float = 1.5, floor: float = 1e-6) -> dict:
    """Per pair and stage: better / worse / unchanged (beyond ``factor`` and ``floor``), new and vanished."""
    ma, mb = _metrics(a), _metrics(b)
    changes = []
    for key in sorted(set(ma) | set(mb)):
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
    for pair in sorted(set(fa) | set(fb)):
        sa = (fa.get(pair) or {}).get("stage")
        sb = (fb.get(pair) or {}).get("stage")
        if sa != sb:
            moved.append({"pair": pair, "before": sa, "after": sb})
    return {"verdict": {"before": a.verdict, "after": b.verdict}, "first_divergence": moved, "stages": changes}


def diff_commits(dir_a: Path, dir_b: Path, factor: float = 1.5, floor: float = 1e-6) -> dict:
    ra, rb = reports(dir_a), reports(dir_b)
    out = {"before": Path(dir_a).name, "after": Path(dir_b).name, "runs": {}}
    for name in sorted(set(ra) | set(rb)):
        if name not in ra or name not in rb:
            out["runs"][name] = {"only_in": Path(dir_b if name in rb else dir_a).name}
            continue
        out["runs"][name] = diff_reports(ra[name], rb[name], factor, floor)
    return out


def format_diff(diff: dict) -> str:
    lines = [f"driftscope diff {diff['before']} -> {diff['after']}"]
    for name, run in diff["runs"].items():
        if "only_in" in run:
            lines.append(f"\n{name}: only in {run['only_in']}")
            continue
        changed = [c for c in run["stages"] if c["change"] != "unchanged"]
        lines.append(
            f"\n{name}: verdict {run['verdict']['before']} -> {run['verdict']['after']}; "
            f"{len(changed)} changed stage(s)"
        )
        for move in run["first_divergence"]:
            lines.append(f"  first divergence of {move['pair']}: {move['before']} -> {move['after']}")
        for change in changed:
            before = "-" if change["before"] is None else f"{change['before']:.3g}"
            after = "-" if change["after"] is None else f"{change['after']:.3g}"
            lines.append(f"  {change['change']:9s} {change['pair']:24s} {change['stage']:40s} {before} -> {after}")
    return "\n".join(lines)


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
    grid = np.array(
        [[math.log10(max(c.get(s, np.nan), 1e-12)) if s in c else np.nan for c in columns] for s in stage_order]
    )
    figure = Figure(figsize=(1.2 * len(commits) + 4, 0.16 * max(len(stage_order), 10) + 1.5), layout="constrained")
    axis = figure.subplots()
    shown = axis.imshow(grid if grid.size else np.zeros((1, 1)), aspect="auto", cmap="viridis", interpolation="nearest")
    axis.set_xticks(range(len(commits)), commits, rotation=45, fontsize=8)
    axis.set_yticks(range(len(stage_order)), [s.replace("vision.", "") for s in stage_order], fontsize=6)
    axis.set_title(f"{run}: log10 max_abs per stage and commit" + (f" ({pair})" if pair else ""))
    figure.colorbar(shown, ax=axis, label="log10 max_abs")
    return figure
