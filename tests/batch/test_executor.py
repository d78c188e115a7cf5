"""When the executor fails: a lost Dask worker, Ctrl-C and SIGTERM. Real processes, real signals, real Dask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from xml.etree import ElementTree

import psutil
import pytest
import yaml
from conftest import ROOT, TINY

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"


def _params(name: str, notebooks: list[str], image: str = str(CHECKER)) -> dict:
    return {
        "name": name,
        "checkpoint": str(TINY),
        "images": [image],
        "runtimes": ["transformers:f32", "mlx:f32"],
        "replay": False,
        "notebooks": notebooks,
    }


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _status(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _gone(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still alive (zombies count as gone)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


def _repo(tmp_path: Path, files: dict[str, dict]) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, data in files.items():
        (repo / name).write_text(yaml.safe_dump(data))
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=ci", "-c", "user.email=ci@x", "commit", "-qm", "A"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, capture_output=True, text=True)
    return repo, sha.stdout.strip()


def test_sigterm_stops_the_runs_removes_the_worktree_and_writes_the_evidence(tmp_path):
    repo, sha = _repo(
        tmp_path,
        {"one.yaml": _params("one", ["01_stage_parity"]), "two.yaml": _params("two", ["01_stage_parity"])},
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "driftscope", "batch", "one.yaml", "two.yaml", "--commit", "HEAD"]
    batch = subprocess.Popen(
        command + ["--jobs", "2", "--out-root", str(out)],
        cwd=repo,
        stdout=open(tmp_path / "batch.log", "w"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )
    try:
        reports = [out / sha / name / "report.json" for name in ("one", "two")]
        _wait_for(lambda: all(_status(r) == "running" for r in reports), 240, "both runs to start")
        worktrees = list(Path(tempfile.gettempdir()).glob(f"driftscope-{sha}-*"))
        assert len(worktrees) == 1  # the commit's temporary worktree exists while it runs
        running = _descendants(batch.pid)
        assert len(running) >= 2  # each run's own process, and whatever it started
        batch.send_signal(signal.SIGTERM)
        assert batch.wait(timeout=120) == 2
    finally:
        if batch.poll() is None:
            batch.kill()
    log = (tmp_path / "batch.log").read_text()
    assert "Traceback" not in log, log
    assert not _gone(running), [p.cmdline() for p in _gone(running)]
    assert not worktrees[0].exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert listed.count("\n") == 1, listed
    for report in reports:  # the killed investigations' reports say so
        data = json.loads(report.read_text())
        assert data["status"] == "error" and "stopped" in data["error"]["message"], data["error"]
    index = (out / sha / "index.html").read_text()
    assert "2 run(s): 0 pass, 0 fail, 2 could not run; exit code 2" in index and "SIGTERM" in index
    junit = ElementTree.parse(out / sha / "junit.xml").getroot()
    assert junit.get("errors") == "2" and "interrupted" in junit.find("testcase/error").get("message")


def test_ctrl_c_cancels_the_runs_on_the_dask_workers(tmp_path):
    from distributed import Client, LocalCluster

    (tmp_path / "one.yaml").write_text(yaml.safe_dump(_params("one", ["01_stage_parity"])))
    out = tmp_path / "out"
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        command = [sys.executable, "-m", "driftscope", "batch", "one.yaml", "--scheduler", c.scheduler_address]
        batch = subprocess.Popen(
            command + ["--out-root", str(out)],
            cwd=tmp_path,
            stdout=open(tmp_path / "batch.log", "w"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
        )
        try:
            report = out / "nocommit" / "one" / "report.json"
            _wait_for(lambda: _status(report) == "running", 240, "the run to start on the worker")
            worker_pid = next(iter(client.run(os.getpid).values()))
            running = _descendants(worker_pid)
            assert running, "the run's processes on the worker"
            batch.send_signal(signal.SIGINT)
            assert batch.wait(timeout=120) == 2
        finally:
            if batch.poll() is None:
                batch.kill()
        assert not _gone(running), [p.cmdline() for p in _gone(running)]
        assert not any(client.processing().values())  # no task left on the cluster
    assert _status(report) == "error"
    index = (out / "nocommit" / "index.html").read_text()
    assert "1 run(s): 0 pass, 0 fail, 1 could not run; exit code 2" in index and "SIGINT" in index
    assert "Traceback" not in (tmp_path / "batch.log").read_text()


@pytest.mark.slow
def test_a_lost_worker_marks_its_run_dead_and_keeps_what_finished(tmp_path):
    """The worker dies with its processes (a lost host) while the second run executes: KilledWorker."""
    import dask
    from distributed import Client, LocalCluster
    from driftscope.batch.runner import run_batch

    files = []
    for name in ("first", "second"):
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(yaml.safe_dump(_params(name, [])))
    out = tmp_path / "out"
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        results = []
        thread = threading.Thread(
            target=lambda: results.append(run_batch(files, scheduler=c.scheduler_address, out_root=out, log=print))
        )
        thread.start()
        first, second = (out / "nocommit" / name for name in ("first", "second"))
        _wait_for(lambda: (first / "run.json").exists(), 300, "the first run to finish")
        _wait_for(lambda: _status(second / "report.json") == "running", 300, "the second run to start")
        worker = psutil.Process(next(iter(client.run(os.getpid).values())))
        for process in [*worker.children(recursive=True), worker]:
            process.kill()
        thread.join(timeout=300)
    result = results[0]
    by_name = {s["name"]: s for s in result.summaries}
    assert by_name["first"]["verdict"] == "pass" and not by_name["first"]["error"]
    assert "KilledWorker" in by_name["second"]["error"] and result.code == 2
    data = json.loads((second / "report.json").read_text())
    assert data["status"] == "error" and data["error"]["type"] == "RunLost"
    index = (out / "nocommit" / "index.html").read_text()
    assert "2 run(s): 1 pass, 0 fail, 1 could not run; exit code 2" in index
    assert json.loads((second / "run.json").read_text())["error"].startswith("could not run: the worker")
