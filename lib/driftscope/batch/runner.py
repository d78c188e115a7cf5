"""Per-commit batches: every parameter file's run for one commit, then the commit's evidence index and JUnit XML.

Guarantees (docs/guide/per-commit.md states them for users):

- two parameter files with the same run name are refused before anything runs;
- the index and the JUnit XML are replaced when the batch starts (its runs "in progress") and always
  written at its end, also when the executor fails or the batch is stopped: they list every run of the
  commit under the output root, newest result per run, never the previous batch's view;
- runs of ``--commit REV`` run today's parameter files in REV's tree and are reused like HEAD's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from driftscope.batch.executor import BatchInterrupted, execute, interruptible, not_run
from driftscope.batch.worker import RunTask, run_dir_name, write_record
from driftscope.core.paths import outputs_root
from driftscope.core.storage import OutputRoot, is_url
from driftscope.core.worktree import checkout, short_sha, toplevel
from driftscope.core.yamlfile import load_yaml
from driftscope.errors import ParameterError
from driftscope.run.runrecord import commit_entries, counts, exit_code, mark_dead


@dataclass
class BatchResult:
    """This batch's run summaries and the commit's evidence (every run under the root)."""

    commit: str
    summaries: list[dict]
    entries: list[dict]
    index: str
    junit: str
    problem: str | None = None

    @property
    def code(self) -> int:
        """The gate: the exit code the index's headline states."""
        return exit_code(self.entries)


def run_name(path: Path, text: str) -> str:
    """The run's name as :func:`driftscope.run.params.parse_parameters` gives it: ``name``, else the file's stem."""
    try:
        data = load_yaml(text)
    except yaml.YAMLError:
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else path.stem


def _repository(files: list[Path]) -> tuple[Path, list[str], bool]:
    """(the parameter files' repository root, or outside one the current directory; their names; in git?)."""
    tops = {toplevel(path.parent) for path in files}
    if len(tops) > 1:
        raise ParameterError(
            f"the parameter files come from different repositories: {sorted(str(t) for t in tops)}",
            "run one batch per repository",
        )
    top = tops.pop()
    if top is None:
        return Path.cwd(), [str(path) for path in files], False
    return top, [path.relative_to(top).as_posix() for path in files], True


def _refuse_duplicates(files: list[Path], names: list[str]) -> None:
    seen: dict[str, list[str]] = {}
    for path, name in zip(files, names, strict=True):
        seen.setdefault(run_dir_name(name), []).append(str(path))
    repeated = {name: paths for name, paths in seen.items() if len(paths) > 1}
    if repeated:
        listed = "; ".join(f"{name!r}: {', '.join(paths)}" for name, paths in sorted(repeated.items()))
        raise ParameterError(
            f"parameter files share a run name (their results would overwrite each other): {listed}",
            "give each parameter file its own 'name'",
        )


#: fsspec protocols whose files live in one process's memory: nothing written there outlives the batch, and each
#: Dask worker would keep its own
VOLATILE = ("memory",)


def _refuse_volatile_root(out_root: str | Path | None, scheduler: str | None) -> None:
    """Refuse an output root no later process can read: one in this process's memory (memory://; with a scheduler,
    each worker's own), or, with a Dask scheduler, a relative path each worker would resolve on its own."""
    if out_root is None:
        return
    location = str(out_root)
    if is_url(location) and location.split("://", 1)[0] in VOLATILE:
        where = "each Dask worker's outputs in that worker's own memory" if scheduler else "the outputs in memory"
        raise ParameterError(
            f"--out-root {location} keeps {where}: they vanish with the process, and no later reader "
            "(driftscope diff, show, a review) can read them",
            "pass a root that keeps them (a local folder, an absolute path every worker mounts, s3://..., gs://...)",
        )
    if scheduler is not None and not is_url(location) and not Path(location).expanduser().is_absolute():
        raise ParameterError(
            f"--out-root {location} is a relative path: each Dask worker would resolve it against its own folder",
            "pass an absolute path every worker mounts, or a URL such as s3://bucket/runs",
        )


def run_batch(
    params_files: list[str | Path],
    commit: str | None = None,
    jobs: int = 1,
    scheduler: str | None = None,
    force: bool = False,
    out_root: str | Path | None = None,
    log: Callable[[str], None] = print,
    timeout: float | None = None,
) -> BatchResult:
    """Run every parameter file for ``commit`` (default: the checkout as it is); write the index and JUnit XML.

    ``out_root``: a local directory or a URL fsspec understands (default:
    ``outputs/`` of the parameter files' repository, else of the current folder).
    ``timeout``: seconds to reach the Dask ``scheduler`` (default: Dask's connect timeout).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ParameterError(f"--jobs {jobs!r}: a batch needs at least one run at a time", "pass --jobs 1 or more")
    _refuse_volatile_root(out_root, scheduler)
    root = OutputRoot(out_root or outputs_root(params_files[0] if params_files else None))
    files = [Path(p).resolve() for p in params_files]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise ParameterError(f"parameter files do not exist: {missing}", "pass YAML files from parameters/")
    texts = [path.read_text(encoding="utf-8") for path in files]
    names = [run_name(path, text) for path, text in zip(files, texts, strict=True)]
    _refuse_duplicates(files, names)
    top, sources, in_git = _repository(files)
    if commit is not None and not in_git:
        raise ParameterError("--commit needs parameter files inside a git repository", "run without --commit")
    root.check_writable()  # a read-only folder or URL: said now, not as each run's error
    from driftscope.run.environment import current_commit

    label = short_sha(commit, top) if commit else current_commit(top) if in_git else "nocommit"
    batch = uuid.uuid4().hex[:12]
    tasks = [RunTask(name, source, "", label, root.location) for name, source in zip(names, sources, strict=True)]
    summaries: list[dict] = []
    problem = None
    with interruptible():
        try:
            with checkout(label if commit else None, top) as tree:
                tasks = [
                    RunTask(name, source, text, label, root.location, force, str(tree), str(top), batch)
                    for name, source, text in zip(names, sources, texts, strict=True)
                ]
                _evidence(root, label, [not_run(t, "the batch is still running (or was killed)") for t in tasks])
                log(
                    f"batch: {len(tasks)} run(s) for commit {label} -> {root.url(label)}"
                    + (f" on Dask scheduler {scheduler}" if scheduler else f" with {jobs} local job(s)")
                )
                summaries, problem = execute(tasks, jobs, scheduler, log, timeout)
        except BatchInterrupted as err:  # while the worktree was made or removed
            problem = f"the batch was stopped ({err.args[0]})"
            done = {s["name"] for s in summaries}
            summaries += [not_run(t, problem) for t in tasks if t.name not in done]
        for summary in summaries:
            if summary.get("lost"):
                _bury(root, label, summary)
        try:
            result = _evidence(root, label, summaries, problem)
        except BatchInterrupted:  # a signal during the last writes: write them again (no second interruption)
            result = _evidence(root, label, summaries, problem)
    found = counts(summaries)
    log(
        f"batch: {len(summaries)} run(s) for {label}: {found['pass']} pass, {found['fail']} fail, "
        f"{found['error']} could not run" + (f"; {problem}" if problem else "")
    )
    return BatchResult(label, summaries, result[0], result[1], result[2], problem)


def _bury(root: OutputRoot, label: str, summary: dict) -> None:
    """A run whose worker was lost: its report, left ``running``, is marked dead; its record says so."""
    task_dir = run_dir_name(summary["name"])
    summary["dir"] = task_dir
    if not root.remote:
        mark_dead(root.path(label, task_dir), summary["error"])
    write_record(root, label, summary)


def _evidence(root: OutputRoot, label: str, summaries: list[dict], problem: str | None = None):
    from driftscope.batch.evidence import write_index, write_junit

    entries = commit_entries(root, label, summaries)
    return entries, write_index(root, label, entries, problem), write_junit(root, label, entries)
