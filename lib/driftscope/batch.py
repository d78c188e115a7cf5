"""Per-commit batch runs: every parameter set's notebooks, locally (process pool) or on Dask.

``run_one`` is the unit of work (one parameter set -> ``<out_root>/<commit>/<name>/``); it never
raises, so one failing run cannot stop the others; its report says where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import DriftscopeError, ParameterError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ParameterError(
            f"git {' '.join(args)} failed in {cwd}: {done.stderr.strip()}",
            "pass a revision of the repository that holds the parameter files",
        )
    return done.stdout.strip()


@contextlib.contextmanager
def checkout(revision: str | None, where: Path) -> Iterator[tuple[Path, str]]:
    """(working directory, commit label): the current tree, or a temporary git worktree of ``revision``."""
    from .environment import current_commit

    if revision is None:
        yield where, current_commit(where)
        return
    top = Path(_git(["rev-parse", "--show-toplevel"], where))
    sha = _git(["rev-parse", "--short=12", f"{revision}^{{commit}}"], top)
    with tempfile.TemporaryDirectory(prefix=f"driftscope-{sha}-") as temp:
        tree = Path(temp) / "tree"
        _git(["worktree", "add", "--detach", str(tree), sha], top)
        try:
            yield tree, sha
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=top, capture_output=True)


def _resolve(params, tree: Path, fallback: Path):
    """Paths the commit's tree lacks (git-ignored fixtures such as checkpoints) come from the main checkout."""

    def fix(path: Path) -> Path:
        if path.exists():
            return path
        try:
            relative = path.relative_to(tree)
        except ValueError:
            return path
        return fallback / relative if (fallback / relative).exists() else path

    return dataclasses.replace(
        params,
        checkpoint=fix(params.checkpoint),
        images=[fix(p) for p in params.images],
        contract=None if params.contract is None else fix(params.contract),
    )


def run_one(params_file: str, out_root: str, commit: str, tree: str, fallback: str, force: bool = False) -> dict:
    """Execute one parameter set's notebooks into ``out_root/commit/name``; returns a summary, never raises."""
    from .params import load_parameters
    from .render import run_notebooks
    from .report import Report

    start = time.perf_counter()
    summary = {"params": params_file, "commit": commit, "status": "error", "verdict": "error", "error": None}
    try:
        tree_path = Path(tree)
        params = _resolve(load_parameters(params_file, base=tree_path), tree_path, Path(fallback))
        out = Path(out_root) / commit / params.name
        summary.update(name=params.name, out=str(out))
        report_path = out / "report.json"
        if report_path.exists() and not force:
            previous = Report.load(report_path)
            if previous.data.get("status") == "complete" and previous.data.get("parameters_digest") == params.digest:
                summary.update(status="complete", verdict=previous.verdict, skipped=True)
                return summary
        out.mkdir(parents=True, exist_ok=True)
        resolved = out / "parameters.yaml"
        _write_params(params, resolved)
        env_lib = tree_path / "lib"
        notebooks = tree_path / "notebooks" if (tree_path / "notebooks").is_dir() else None
        with _pythonpath(env_lib if (env_lib / "driftscope").is_dir() else None):
            errors = run_notebooks(params.notebooks, out, resolved, not force, tree_path, notebook_dir=notebooks)
        if errors:
            name, error = next(iter(errors.items()))
            summary["error"] = f"notebook {name}: {error}"
        if report_path.exists():
            report = Report.load(report_path)
            summary.update(
                status=report.data.get("status"), verdict=report.verdict, stopped_at=report.data.get("stopped_at")
            )
            if report.data.get("status") != "complete":
                error = report.data.get("error") or {}
                summary["error"] = (
                    f"stopped at {report.data.get('stopped_at')}: {error.get('message')}" if error else summary["error"]
                )
        elif summary["error"] is None:
            summary["error"] = "no report.json was written"
    except DriftscopeError as err:
        summary["error"] = str(err)
    except Exception as err:  # noqa: BLE001 - a run that cannot execute is reported, not raised
        summary["error"] = f"{type(err).__name__}: {err}"
    finally:
        summary["seconds"] = round(time.perf_counter() - start, 2)
    if summary["error"] and summary["status"] == "complete":
        summary["status"] = "error"
    return summary


def _write_params(params, path: Path) -> None:
    """The resolved parameters (absolute paths) the notebooks of this run load."""
    import yaml

    data = {k: v for k, v in params.to_dict().items() if v not in (None, [], {})}
    data["runtimes"] = [{k: v for k, v in r.items() if v not in (None, {}, [])} for r in data["runtimes"]]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@contextlib.contextmanager
def _pythonpath(lib: Path | None) -> Iterator[None]:
    """Kernels import the commit's own driftscope (``<tree>/lib``) when the tree has one."""
    if lib is None:
        yield
        return
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(lib) + (os.pathsep + previous if previous else "")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def run_batch(
    params_files: list[str | Path],
    commit: str | None = None,
    jobs: int = 1,
    scheduler: str | None = None,
    force: bool = False,
    out_root: str | Path | None = None,
    log=print,
) -> tuple[list[dict], Path]:
    """Run every parameter set for ``commit``; write the evidence index and JUnit XML; return summaries and dir."""
    from .views.evidence import write_index, write_junit

    out_root = Path(out_root or REPO_ROOT / "outputs").resolve()
    files = [Path(p).resolve() for p in params_files]
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise ParameterError(f"parameter files do not exist: {missing}", "pass YAML files from parameters/")
    where = files[0].parent
    with checkout(commit, where) as (tree, label):
        top = Path(_git(["rev-parse", "--show-toplevel"], where)) if commit else where
        mapped = [str(tree / p.relative_to(top)) if commit else str(p) for p in files]
        fallback = str(top if commit else tree)
        tasks = [(path, str(out_root), label, str(tree if commit else Path.cwd()), fallback, force) for path in mapped]
        log(
            f"batch: {len(tasks)} run(s) for commit {label} -> {out_root / label}"
            + (f" on Dask scheduler {scheduler}" if scheduler else f" with {jobs} local job(s)")
        )
        summaries = _execute(tasks, jobs, scheduler)
    for summary in summaries:
        log(
            f"  {summary.get('name', summary['params'])}: {summary['verdict']}"
            + (f" ({summary['error']})" if summary.get("error") else "")
            + (" [reused]" if summary.get("skipped") else "")
        )
    directory = out_root / label
    directory.mkdir(parents=True, exist_ok=True)
    write_index(directory, summaries)
    write_junit(directory / "junit.xml", summaries)
    return summaries, directory


def _execute(tasks: list[tuple], jobs: int, scheduler: str | None) -> list[dict]:
    if scheduler:
        from distributed import Client

        with Client(scheduler) as client:
            futures = [client.submit(run_one, *task, pure=False) for task in tasks]
            return client.gather(futures)
    if jobs <= 1 or len(tasks) == 1:
        return [run_one(*task) for task in tasks]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run_one, *zip(*tasks, strict=True)))


def exit_code(summaries: list[dict]) -> int:
    """0: every verdict passes; 1: a verdict fails; 2: a run could not execute."""
    if any(s["status"] != "complete" or s.get("error") for s in summaries):
        return 2
    return 0 if all(s["verdict"] == "pass" for s in summaries) else 1
