"""One run of a batch, wherever it executes: a local thread or a Dask worker on another host.

A :class:`RunTask` carries no path of the submitting machine that the worker must read: the parameter
file's text, its repository-relative name, the commit and the output root (a path or a URL). The worker
finds the commit's tree (the submitter's, when this host sees it at that commit; else its own checkout,
``$DRIFTSCOPE_CHECKOUT`` or the current directory's repository, in a temporary worktree when HEAD is
another commit), runs ``python -m driftscope run`` there in a child process (the tree's own driftscope
when it has one), and writes the result under the root; for a URL root it works in a local scratch
directory and uploads the finished directory through fsspec. ``run_one`` never raises.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from driftscope.core.atomic import write_text_atomic
from driftscope.core.names import safe_name
from driftscope.core.storage import OutputRoot, is_url
from driftscope.core.worktree import head_matches, temporary_worktree, toplevel
from driftscope.core.yamlfile import load_yaml
from driftscope.errors import DriftscopeError, ParameterError
from driftscope.run.reuse import PACKAGE_DIR, reads, stale_reason
from driftscope.run.runrecord import RECORD, duration, from_report, mark_dead, now

CHECKOUT_ENV = "DRIFTSCOPE_CHECKOUT"
LOG_NAME = "batch.log"  # the child's own output (its progress, a notebook's failure, a bad parameter)
#: an earlier run's pages (a notebook's name ``NN_name``), removed before the run executes again: nothing else
RENDERED = re.compile(r"\d{2}_[A-Za-z0-9_]+(\.nocode)?\.(ipynb|html)")


class RunStopped(Exception):
    """The batch was stopped (Ctrl-C, SIGTERM) while this run was executing."""


@dataclass(frozen=True)
class RunTask:
    """One parameter file to run for one commit."""

    name: str  # the run's name (the parameter file's ``name``, or its stem)
    source: str  # the parameter file, relative to its repository (absolute outside one)
    text: str  # the file's YAML as the submitter read it (today's file, also for --commit)
    commit: str  # outputs/<commit>/
    root: str  # output root: a local path or an fsspec URL
    force: bool = False
    tree: str | None = None  # the submitter's tree at the commit: used where this host sees it
    fallback: str | None = None  # the submitter's checkout: git-ignored fixtures the commit's tree lacks
    batch: str = ""  # the batch's id (Dask stop event and progress topic)


def run_dir_name(name: str) -> str:
    """The directory of the run named ``name`` under ``<root>/<commit>/`` (the one place that says so):
    a name is a label, never a path (``names.safe_name``)."""
    return safe_name(name)


def run_one(
    task: RunTask,
    stop: Callable[[], bool] | None = None,
    notify: Callable[[dict], None] | None = None,
    own_checkout: str | None = None,
) -> dict:
    """Execute one run; return its summary (also written as ``run.json``). Never raises.

    ``stop``: polled while the run executes; when true the run's processes are killed. ``notify``: called
    with ``{"event": "start", ...}`` as the run starts. ``own_checkout``: this worker's own checkout.
    """
    start, wall = time.perf_counter(), now()
    directory = run_dir_name(task.name)
    summary = {
        "name": task.name,
        "params": task.source,
        "commit": task.commit,
        "dir": directory,
        "status": "error",
        "verdict": "error",
        "reasons": [],
        "error": None,
        "reused": False,
        "host": socket.gethostname(),
        "started": wall,
    }
    if stop is not None and stop():
        return dict(summary, error="not run: the batch was stopped", seconds=0.0, started=None)
    if notify is not None:
        notify({"event": "start", "name": task.name, "host": summary["host"]})
    root = None
    try:
        root = OutputRoot(task.root)
        with _tree(task, own_checkout) as (tree, fallback):
            summary["checkout"] = str(tree)
            params = _parameters(task, tree)
            package = _package(tree)
            _link_inputs(params, tree, Path(fallback))  # before the reuse check reads what the run would read
            previous = None if task.force else _reusable(root, task.commit, directory, params, package)
            if previous is not None:
                report, seconds = previous
                summary.update(from_report(report), reused=True, seconds=seconds)
                return summary
            summary["reads"] = reads(params, package)  # what the run reads, by content: a later reuse checks it
            with _workspace(root, task.commit, directory) as out:
                summary.update(_execute(task, params, tree, out, stop))
    except RunStopped:
        summary["error"] = "interrupted: the batch was stopped while this run executed"
    except DriftscopeError as err:
        summary["error"] = str(err)
    except Exception as err:  # noqa: BLE001 - a run that cannot execute is reported, not raised
        summary["error"] = f"{type(err).__name__}: {err}"
    if summary["error"] and summary["status"] == "complete":
        summary["status"] = "error"
    if not summary.get("reused"):
        summary["seconds"] = round(time.perf_counter() - start, 2)
        if root is not None:
            write_record(root, task.commit, summary)
    return summary


def _package(tree: Path) -> Path:
    """driftscope's package that runs the parameters in ``tree``: the tree's own, else this process's."""
    own = tree / "lib" / "driftscope"
    return own if own.is_dir() else PACKAGE_DIR


def _reusable(root: OutputRoot, commit: str, directory: str, params, package: Path) -> tuple[dict, float] | None:
    """(report, original seconds) of a finished run of these parameters whose notebooks all rendered, judged under
    the parameter file's contract and runtimes, on the bytes it names today (``run.reuse``)."""
    report = root.read_json(commit, directory, "report.json")
    if not report or report.get("status") != "complete" or report.get("parameters_digest") != params.digest:
        return None
    record = root.read_json(commit, directory, RECORD) or {}
    if stale_reason(report, params, record.get("reads") or report.get("reads"), package):
        return None
    if record.get("report_updated") == report.get("updated"):  # the batch that ran it says how it ended
        return None if record.get("error") else (report, float(record.get("seconds") or duration(report)))
    pages = set(root.files(commit, directory))
    rendered = all(f"{Path(name).stem}.html" in pages for name in params.notebooks)
    return (report, duration(report)) if rendered else None


def _parameters(task: RunTask, tree: Path):
    """The task's parameters, repository-relative paths resolved in ``tree`` (URLs fetched to the cache)."""
    from driftscope.run.params import parse_parameters

    try:
        data = load_yaml(task.text)
    except yaml.YAMLError as err:
        raise ParameterError(f"parameter file {task.source} is not valid YAML: {err}", "fix the YAML syntax") from err
    if isinstance(data, dict):
        data = dict(data, name=task.name)
    return parse_parameters(data, task.source, base=tree)


def _link_inputs(params, tree: Path, fallback: Path) -> None:
    """Inputs the commit's tree lacks (git-ignored checkpoints) are linked in from the main checkout."""
    from driftscope.core.worktree import link_missing

    written = params.written
    names = [written.get("checkpoint"), *written.get("images", []), *written.get("videos", []), written.get("contract")]
    relative = [n for n in names if isinstance(n, str) and not is_url(n) and not Path(n).expanduser().is_absolute()]
    link_missing(tree, fallback, relative)


@contextlib.contextmanager
def _tree(task: RunTask, own_checkout: str | None) -> Iterator[tuple[Path, str]]:
    """(the commit's tree on this host, the checkout whose git-ignored fixtures it may borrow)."""
    if own_checkout is None and task.tree and Path(task.tree).is_dir():
        if task.commit == "nocommit" or head_matches(Path(task.tree), task.commit):
            yield Path(task.tree), task.fallback or task.tree
            return
    start = Path(own_checkout) if own_checkout else Path.cwd()
    top = toplevel(start) or start
    if task.commit == "nocommit" or head_matches(top, task.commit):
        yield top, str(top)
        return
    sha = task.commit.removesuffix("-dirty")
    known = subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=top, capture_output=True)
    if known.returncode != 0:
        raise ParameterError(
            f"this worker's checkout {top} (host {socket.gethostname()}) does not have commit {sha}",
            f"git fetch there, or start the worker with {CHECKOUT_ENV}=<a checkout that has it>",
        )
    with temporary_worktree(top, sha) as tree:
        yield tree, str(top)


@contextlib.contextmanager
def _workspace(root: OutputRoot, commit: str, directory: str) -> Iterator[Path]:
    """The run's directory: in place under a local root; a scratch directory uploaded after, for a URL."""
    if not root.remote:
        out = root.path(commit, directory)
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="driftscope-run-", dir=os.environ.get("DRIFTSCOPE_SCRATCH")) as scratch:
        out = Path(scratch) / directory
        out.mkdir()
        yield out
        root.upload(out, commit, directory)


def _execute(task: RunTask, params, tree: Path, out: Path, stop) -> dict:
    """``driftscope run`` of the parameters into ``out`` in a child process; what its report says."""
    for stale in [p for p in out.iterdir() if p.is_file() and (RENDERED.fullmatch(p.name) or p.name == RECORD)]:
        stale.unlink()  # pages of an earlier run: never shown as this run's
    data = load_yaml(task.text)
    write_text_atomic(out / "parameters.yaml", yaml.safe_dump(dict(data, name=params.name), sort_keys=False))
    command = [sys.executable, "-m", "driftscope", "run", str(out / "parameters.yaml"), "--out", str(out)]
    with open(out / LOG_NAME, "w", encoding="utf-8") as log:
        child = subprocess.Popen(
            command + (["--force"] if task.force else []),
            cwd=tree,
            env=_child_env(tree),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            code = _wait(child, stop)
        except RunStopped:
            mark_dead(out, "interrupted: the batch was stopped")
            raise
    result = {"status": "error", "verdict": "error", "error": None}
    report = out / "report.json"
    if report.exists():
        result.update(from_report(json.loads(report.read_text())))
    died = result.get("status") == "running"  # the child is gone and its report still says running
    if died or code not in (0, 1) or not report.exists():
        reason = _failure(out / LOG_NAME, code)  # e.g. "driftscope run killed by signal 11"
        result["error"] = reason if died or result["error"] is None else result["error"]
    if died:
        mark_dead(out, f"dead: {reason}")
        result.update(status="error", verdict="error")
    return result


def _child_env(tree: Path) -> dict[str, str]:
    """The tree's own driftscope first on the path; the IREE artifact cache of the main checkout."""
    from driftscope.capture.iree import default_cache_dir
    from driftscope.run.params import ROOT_VARIABLE

    env = dict(os.environ)
    env.setdefault("DRIFTSCOPE_CACHE", str(default_cache_dir().parent))
    env[ROOT_VARIABLE] = str(tree)  # the saved parameter file's relative paths are the commit tree's
    if (tree / "lib" / "driftscope").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree / "lib"), env.get("PYTHONPATH")) if p)
    return env


def _wait(child: subprocess.Popen, stop) -> int:
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if stop is not None and stop():
                kill_tree(child.pid)
                child.wait()
                raise RunStopped() from None


def kill_tree(pid: int, grace: float = 5.0) -> None:
    """SIGTERM a process and every process under it (the notebook kernels), then SIGKILL what is left."""
    import psutil

    try:
        parent = psutil.Process(pid)
        processes = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=grace)


def _failure(log: Path, code: int) -> str:
    """Why the child failed, from its own output: a notebook's error or driftscope's message."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    said = [
        line
        for before, line in zip(["", *lines], lines, strict=False)
        if "failed:" in line or "not run:" in line or "driftscope: error:" in line or "driftscope: error:" in before
    ]
    if said:
        return "; ".join(line.split("] ", 1)[-1] for line in said[:3])
    reason = f"killed by signal {-code}" if code < 0 else f"exited {code}"
    return f"driftscope run {reason}" + (f": {lines[-1]}" if lines else "") + f" (see {LOG_NAME})"


def write_record(root: OutputRoot, commit: str, summary: dict) -> None:
    """Write ``run.json`` next to the run's report (best effort: an unreachable root is in the summary)."""
    try:
        root.write_text(commit, summary["dir"], RECORD, text=json.dumps(dict(summary, finished=now()), indent=1) + "\n")
    except Exception as err:  # noqa: BLE001 - the summary still reaches the submitter
        summary["error"] = summary["error"] or f"could not write {RECORD}: {type(err).__name__}: {err}"
