"""One investigation per output directory: a second process fails clearly, or waits for the result (reuse)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY
from driftscope.run.investigation import InvestigationFailed, investigate
from driftscope.run.params import parse_parameters
from driftscope.run.runlock import BusyError, run_lock

PARAMS = {
    "name": "locked",
    "checkpoint": str(TINY),
    "images": [str(ROOT / "fixtures" / "images" / "checkerboard_140.png")],
    "runtimes": ["transformers:f32", "mlx:f32"],
}

# Another process holds the directory's lock, writes the run's report and log, then says so ("held": the
# state the tests go on from exists by then) and holds on for `hold` seconds.
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from driftscope.run.params import parse_parameters
    from driftscope.run.report import Report
    from driftscope.run.runlock import run_lock

    out, status, hold = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    params = parse_parameters({params!r}, "test")
    with run_lock(out):
        report = Report.start(out / "report.json", name=params.name, parameters_digest=params.digest, pid=os.getpid())
        report.step("capture:mlx:f32")
        (out / "investigation.log").write_text("[driftscope 00:00:00] capture mlx:f32: 71 stages\\n")
        (out / "held").touch()
        time.sleep(hold)
        if status == "complete":  # a judged run: a verdict and its rows, as the report schema asks, and what a
            # finished run records for its reuse (its contract, runtimes, reference and what it read)
            from driftscope.judge.contract import load_contract
            from driftscope.run.reuse import reads

            report.data.update(
                status="complete",
                verdict={{"status": "pass", "reasons": []}},
                rows=[],
                contract=load_contract(params.contract).to_dict(),
                runtimes=[{{"label": spec.display}} for spec in params.runtimes],
                reference=params.reference_label,
                reads=reads(params),
            )
            report.step("done")
        else:
            report.fail(RuntimeError("planted crash"))
    """
).format(params=PARAMS)


def hold(out: Path, status: str, seconds: float) -> subprocess.Popen:
    """Start the holder and return once it holds the lock and has written its report and log."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), status, str(seconds)])
    deadline = time.monotonic() + 60
    while not (out / "held").exists():
        assert child.poll() is None, "the holder exited before taking the lock"
        assert time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.05)
    return child


def test_a_second_run_into_a_busy_directory_fails_naming_the_holder_and_the_fix(tmp_path):
    child = hold(tmp_path, "complete", 30)
    try:
        with pytest.raises(BusyError, match=rf"pid {child.pid}\) is writing to") as caught:
            with run_lock(tmp_path):
                pass
        assert "another output directory" in str(caught.value)
        # the same refusal through investigate without reuse: nothing is run, the holder's report is untouched
        with pytest.raises(BusyError):
            investigate(parse_parameters(PARAMS, "test"), tmp_path)
        assert '"stopped_at": "capture:mlx:f32"' in (tmp_path / "report.json").read_text()
    finally:
        child.kill()
        child.wait()
    with run_lock(tmp_path) as lock:  # the lock dies with its process
        assert not lock.waited


def test_reuse_waits_for_the_running_investigation_and_returns_its_report(tmp_path, monkeypatch, capsys):
    import driftscope.run.investigation as investigation

    monkeypatch.setattr(investigation, "get_runtime", lambda *a, **k: pytest.fail("a runtime was run"))
    child = hold(tmp_path, "complete", 1.5)
    report = investigate(parse_parameters(PARAMS, "test"), tmp_path, reuse=True)
    assert child.wait() == 0
    # the holder writes "complete" only after its hold: a report that says so was read after it ended
    assert report.data["status"] == "complete" and report.data["stopped_at"] == "done"
    printed = capsys.readouterr().out
    assert "waiting for the investigation running in" in printed and f"pid {child.pid}" in printed
    assert "capture mlx:f32: 71 stages" in printed  # the run's own log, shown where the waiter's output goes


def test_reuse_raises_the_error_of_the_run_it_waited_for_instead_of_running_again(tmp_path, monkeypatch):
    import driftscope.run.investigation as investigation

    monkeypatch.setattr(investigation, "get_runtime", lambda *a, **k: pytest.fail("a runtime was run"))
    child = hold(tmp_path, "error", 0.5)
    with pytest.raises(InvestigationFailed, match="stopped at capture:mlx:f32: RuntimeError: planted crash"):
        investigate(parse_parameters(PARAMS, "test"), tmp_path, reuse=True)
    assert child.wait() == 0


def test_a_notebook_whose_run_died_does_not_run_the_investigation_again(tmp_path, monkeypatch):
    """A kernel of a ``driftscope run``'s render process (``DRIFTSCOPE_RUN_PID`` set) that reaches the directory
    after its run was killed finds the lock free: it refuses, naming the run, instead of investigating (the race
    the render process's own end with its run leaves open)."""
    import driftscope.run.investigation as investigation
    from driftscope.run.runlock import RUN_PID

    monkeypatch.setattr(investigation, "get_runtime", lambda *a, **k: pytest.fail("a runtime was run"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setenv(RUN_PID, str(dead.pid))
    with pytest.raises(BusyError, match=f"pid {dead.pid}.*no longer holds") as caught:
        investigate(parse_parameters(PARAMS, "test"), tmp_path, reuse=True)
    assert "driftscope run" in caught.value.fix
    assert not (tmp_path / "report.json").exists()
    monkeypatch.delenv(RUN_PID)  # a notebook opened by hand (no run behind it) investigates as before
    child = hold(tmp_path, "complete", 0.5)
    assert investigate(parse_parameters(PARAMS, "test"), tmp_path, reuse=True).data["status"] == "complete"
    assert child.wait() == 0
