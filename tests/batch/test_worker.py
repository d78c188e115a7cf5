"""A batch run where it executes: a Dask worker on "another host" with its own checkout and a URL output root,
and a commit's worktree that shares the main checkout's IREE artifact cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"


def _commit_all(repo: Path) -> str:
    for args in (["add", "."], ["-c", "user.name=ci", "-c", "user.email=ci@x", "commit", "-qm", "A"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True)
    return done.stdout.strip()


def _texts(folder: Path) -> dict[Path, str]:
    return {p: p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file() and p.suffix != ".safetensors"}


@pytest.fixture
def remote_cluster(tmp_path):
    """A real ``dask scheduler`` and a real ``dask worker``: the worker runs in a directory of its own with
    its own clone of the parameters' repository (``DRIFTSCOPE_CHECKOUT``), cache and scratch."""
    from distributed import Client

    worker_home = tmp_path / "worker-host"
    (worker_home / "cwd").mkdir(parents=True)
    (worker_home / "scratch").mkdir()
    started = []
    scheduler_file = tmp_path / "scheduler.json"
    dask = str(Path(sys.executable).with_name("dask"))
    started.append(
        subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
            + ["--scheduler-file", str(scheduler_file)],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "scheduler.log", "w"),  # noqa: SIM115 - closed with the process
        )
    )

    def start_worker(checkout: Path) -> None:
        env = dict(
            os.environ,
            DRIFTSCOPE_CHECKOUT=str(checkout),
            DRIFTSCOPE_CACHE=str(worker_home / "cache"),
            DRIFTSCOPE_SCRATCH=str(worker_home / "scratch"),
        )
        started.append(
            subprocess.Popen(
                [dask, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1", "--no-dashboard"],
                cwd=worker_home / "cwd",
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(worker_home / "worker.log", "w"),  # noqa: SIM115 - closed with the process
            )
        )
        deadline = time.monotonic() + 120
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        with Client(scheduler_file=str(scheduler_file), timeout=60) as client:
            client.wait_for_workers(1, timeout=120)

    try:
        yield start_worker, scheduler_file, worker_home
    finally:
        for process in reversed(started):
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_a_worker_on_another_host_runs_from_its_own_checkout_and_writes_through_fsspec(tmp_path, remote_cluster):
    start_worker, scheduler_file, worker_home = remote_cluster
    from driftscope.batch.runner import run_batch

    store = tmp_path / "object-store"  # stands for s3://bucket: reached only through its URL
    shutil.copytree(TINY, store / "checkpoints" / "tiny", ignore=shutil.ignore_patterns("*.md"))
    submitter = tmp_path / "submitter-checkout"
    (submitter / "images").mkdir(parents=True)
    (submitter / "parameters").mkdir()
    shutil.copy(CHECKER, submitter / "images" / "probe.png")
    params = {
        "name": "remote",
        "checkpoint": (store / "checkpoints" / "tiny").as_uri(),
        "images": ["images/probe.png"],
        "runtimes": ["transformers:f32", "mlx:f32"],
        "replay": False,
        "notebooks": ["01_stage_parity"],
    }
    (submitter / "parameters" / "remote.yaml").write_text(yaml.safe_dump(params))
    subprocess.run(["git", "init", "-q"], cwd=submitter, check=True)
    sha = _commit_all(submitter)
    checkout = worker_home / "checkout"
    subprocess.run(["git", "clone", "-q", str(submitter), str(checkout)], check=True)
    start_worker(checkout)
    address = json.loads(scheduler_file.read_text())["address"]
    root = (store / "runs").as_uri()
    lines = []
    result = run_batch([submitter / "parameters" / "remote.yaml"], scheduler=address, out_root=root, log=lines.append)
    summary = result.summaries[0]
    assert summary["verdict"] == "pass" and not summary["error"], (summary, lines)
    assert summary["checkout"] == str(checkout) and result.code == 0
    assert result.index == f"{root}/{sha}/index.html"
    run = store / "runs" / sha / "remote"
    for name in ("report.json", "run.json", "parameters.yaml", "01_stage_parity.html", "investigation.log"):
        assert (run / name).is_file(), name
    report = json.loads((run / "report.json").read_text())
    assert report["parameters"]["checkpoint"] == params["checkpoint"]
    assert report["parameters"]["images"] == ["images/probe.png"]
    assert report["inputs"]["images"][0] == str(checkout / "images" / "probe.png")  # the worker's own copy
    assert Path(report["checkpoint"]).is_relative_to(worker_home / "cache")  # fetched from the URL
    assert any(Path(t["tapset"]).parts[0] == "taps" for t in report["runtimes"])
    assert (run / report["runtimes"][0]["tapset"]).is_file()  # the taps went up with the report
    index = (store / "runs" / sha / "index.html").read_text()
    assert "1 run(s): 1 pass" in index and 'href="remote/01_stage_parity.html"' in index
    leaked = [path for path, text in _texts(store / "runs").items() if str(submitter) in text]
    assert not leaked  # no task carried a path of the submitting machine
    assert not list((worker_home / "scratch").iterdir())  # the worker's scratch is cleaned up
    assert not (submitter / "outputs").exists() and not (checkout / "outputs").exists()
    assert any(line.startswith("  start remote on ") for line in lines)


@pytest.mark.slow
def test_a_commits_worktree_shares_the_main_checkouts_iree_cache(tmp_path):
    """A checkout with its own driftscope runs ``batch --commit`` twice: the second run's IREE module comes
    from the user's cache folder (the first compile did not go into the temporary worktree)."""
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "lib", repo / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "notebooks", repo / "notebooks")
    (repo / "images").mkdir()
    shutil.copy(CHECKER, repo / "images" / "probe.png")
    (repo / ".gitignore").write_text("outputs/\n")
    params = {
        "name": "iree-run",
        "checkpoint": str(TINY),
        "images": ["images/probe.png"],
        "runtimes": ["transformers:f32", "iree:f32"],
        "stages": {"blocks": True},
        "replay": False,
        "notebooks": ["01_stage_parity"],
    }
    (repo / "iree.yaml").write_text(yaml.safe_dump(params))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    sha = _commit_all(repo)
    env = {k: v for k, v in os.environ.items() if k != "DRIFTSCOPE_CACHE"}
    env["PYTHONPATH"] = str(repo / "lib")
    env["XDG_CACHE_HOME"] = str(tmp_path / "user-cache")  # the user cache folder (platformdirs) on Linux
    hits = []
    for extra in ([], ["--force"]):
        command = [sys.executable, "-m", "driftscope", "batch", "iree.yaml", "--commit", "HEAD", *extra]
        done = subprocess.run(command + ["--out-root", "runs"], cwd=repo, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads((repo / "runs" / sha / "iree-run" / "report.json").read_text())
        artifact = next(r["artifact"] for r in report["runtimes"] if r["label"] == "iree:f32")
        hits.append(artifact["cache_hit"])
    assert hits == [False, True]
    assert (tmp_path / "user-cache" / "driftscope" / "iree" / artifact["key"]).is_dir()
