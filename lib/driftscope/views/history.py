"""Which commits notebook 05 compares: the commit directories of an output root in git-history order (not
directory times), the run to follow (a parameter file's, or the one that changed), and the two commits."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import ParameterError
from .trend import diff_commits, reports, resolve_commit_dir


def _git(args: list[str], repo: Path) -> list[str]:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    return done.stdout.split() if done.returncode == 0 else []


def commit_dirs(out_root: Path, repo: Path, run: str | None = None) -> list[Path]:
    """The commit directories under ``out_root`` holding runs (``run``'s, when given), oldest first by git
    history (a ``-dirty`` directory right after its commit); names git does not know come first, by name."""
    root = Path(out_root)
    found = [
        d
        for d in (sorted(root.iterdir()) if root.is_dir() else [])
        if d.is_dir() and (any(d.glob("*/report.json")) if run is None else run in reports(d))
    ]
    revision = "{}^{{commit}}"
    shas = {
        d: _git(["rev-parse", "--verify", "--quiet", revision.format(d.name.removesuffix("-dirty"))], repo)
        for d in found
    }
    known = sorted({sha[0] for sha in shas.values() if sha})
    order = {sha: index for index, sha in enumerate(reversed(_git(["rev-list", "--topo-order", *known], repo)))}
    position = {d: order.get(sha[0], -1) if sha else -1 for d, sha in shas.items()}
    return sorted(found, key=lambda d: (position[d], d.name.endswith("-dirty"), d.name))


@dataclass(frozen=True)
class TrendChoice:
    """What notebook 05 shows: the run, the older and newer commit directories, the heatmap's commits."""

    root: Path
    run: str
    before: Path
    after: Path
    commits: list[str]


def run_of(params_path: str | Path | None, out_dir: str | Path | None) -> str | None:
    """The run a parameter file (or a run directory) names, or None."""
    if out_dir:
        found = reports(Path(out_dir).parent)
        for name, report in found.items():
            if report.directory.resolve() == Path(out_dir).resolve():
                return name
    if params_path:
        from driftscope.run.params import load_parameters

        return load_parameters(params_path).name
    return None


def choose(
    out_root: str | Path,
    repo: Path,
    run: str | None = None,
    rev_a: str | None = None,
    rev_b: str | None = None,
    factor: float = 1.5,
    names: tuple[str, str] = ("rev_a", "rev_b"),
) -> TrendChoice:
    """The run and commits to compare: ``rev_b`` (default: the newest commit with runs) against ``rev_a``
    (default: the one before it in git history); ``run`` (default: the first run that changed between them).
    ``names``: what the caller calls ``rev_a`` and ``rev_b`` (notebook 05's parameters; the CLI's ``--from``,
    ``--to``), so an error's fix names what the user can pass."""
    root = Path(out_root)
    older, newer = names
    dirs = commit_dirs(root, repo, run)
    if (rev_a is None or rev_b is None) and len(dirs) < 2:
        raise ParameterError(
            f"need runs of two commits under {root}" + (f" for run {run!r}" if run else ""),
            f"run `driftscope batch ... --commit REV` for another revision first (or pass {older} and {newer})",
        )
    after = resolve_commit_dir(root, rev_b) if rev_b else dirs[-1]
    if rev_a:
        before = resolve_commit_dir(root, rev_a)
    else:
        earlier = dirs[: dirs.index(after)] if after in dirs else [d for d in dirs if d != after]
        if not earlier:
            raise ParameterError(
                f"no commit before {after.name} under {root} has runs" + (f" of {run!r}" if run else ""),
                f"run `driftscope batch ... --commit REV` for an older revision first (or pass {older})",
            )
        before = earlier[-1]
    if run is None:
        diff = diff_commits(before, after, factor)
        changed = [name for name, entry in diff["runs"].items() if _changed(entry)]
        run = (changed or sorted(reports(after)) or sorted(diff["runs"]))[0]
    return TrendChoice(root, run, before, after, [d.name for d in dirs if run in reports(d)])


def _changed(entry: dict) -> bool:
    """Whether a run of a commit diff changed: its verdict, a first divergence, or a stage beyond the floor."""
    verdict = entry.get("verdict") or {}
    return (
        "only_in" in entry
        or verdict.get("before") != verdict.get("after")
        or bool(entry.get("first_divergence"))
        or any(change["change"] != "unchanged" for change in entry.get("stages", []))
    )


def from_parameters(
    params_path: str | Path | None,
    out_dir: str | Path | None,
    out_root: str | Path,
    repo: str | Path | None = None,
    run: str | None = None,
    rev_a: str | None = None,
    rev_b: str | None = None,
    factor: float = 1.5,
    names: tuple[str, str] = ("rev_a", "rev_b"),
) -> TrendChoice:
    """Notebook 05's parameters resolved: a run directory (``out_dir``, as ``driftscope run`` passes it) fixes
    the output root, the newer commit and the run; else ``out_root`` (relative: to the working directory, else
    the repository root) and the run a parameter file names. ``repo``: whose git history orders the commits
    (default: the repository holding the output root, else the working directory's)."""
    from driftscope.core.worktree import toplevel
    from driftscope.run.params import find_path

    if out_dir:
        root = Path(out_dir).resolve().parent.parent
        rev_b = rev_b or Path(out_dir).resolve().parent.name
    else:
        root = find_path(out_root).resolve()
    if not root.is_dir():
        raise ParameterError(f"output root {root} does not exist", "pass the out_root `driftscope batch` wrote to")
    repo = Path(repo) if repo else (toplevel(root) or toplevel(Path.cwd()) or Path.cwd())
    return choose(root, repo, run or run_of(params_path, out_dir), rev_a, rev_b, factor, names)


def nothing_to_compare(err: ParameterError) -> str:
    """What notebook 05 says, instead of raising, when its defaults find nothing to compare (a fresh clone)."""
    from driftscope.core.markup import text

    return f"**Nothing to compare yet**: {text(err.problem)}" + (f" (fix: {text(err.fix)})" if err.fix else "")


def headline(choice: TrendChoice) -> str:
    """What is compared, in one line of Markdown."""
    from driftscope.core.markup import code

    return (
        f"Run {code(choice.run)}: commit {code(choice.before.name)} -> {code(choice.after.name)} (in git-history "
        f"order; {len(choice.commits)} commits with this run under {code(choice.root)})"
    )


def verdict_frame(diff: dict):
    """Per run of the two commits: the verdicts, moved first divergences and how many stages changed."""
    import pandas as pd

    records = []
    for name, entry in diff["runs"].items():
        verdict = entry.get("verdict") or {}
        moved = "; ".join(
            f"{m['pair']}: {m['before'] or 'none'} -> {m['after'] or 'none'}" for m in entry.get("first_divergence", [])
        )
        records.append(
            {
                "run": name,
                "before": verdict.get("before", entry.get("only_in") and f"only in {entry['only_in']}" or ""),
                "after": verdict.get("after", entry.get("unreadable") or ""),
                "moved first divergences": moved or "none",
                "changed stages": sum(c["change"] != "unchanged" for c in entry.get("stages", [])),
            }
        )
    return pd.DataFrame(records)


def changes_frame(diff: dict, run: str):
    """The run's stages that got better or worse (or are new or vanished), in execution order."""
    import pandas as pd

    changes = [c for c in diff["runs"].get(run, {}).get("stages", []) if c["change"] != "unchanged"]
    return pd.DataFrame(changes, columns=["pair", "stage", "change", "before", "after"])
