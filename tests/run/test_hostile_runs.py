"""Issue 14, the run half: one exit-code contract, patch errors, the directory lock and killed runs.

One test per numbered case; each failed on the code before the fix. Processes are coordinated through the
state they assert (a marker the child writes once it is there, the report's step), never through sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY
from driftscope.cli import main
from driftscope.errors import HypothesisPatchError, RegistryError
from driftscope.run.investigation import investigate
from driftscope.run.params import load_parameters, parse_parameters

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
PATCHES = ROOT / "tests" / "hostile_patches.py"
RUN = {
    "checkpoint": str(TINY),
    "images": [str(CHECKER)],
    "runtimes": ["transformers:f32", "mlx:f32"],
    "stages": {"blocks": True},
    "replay": False,
    "notebooks": [],
}


def write(path: Path, **changes) -> Path:
    path.write_text(yaml.safe_dump({**RUN, "name": path.stem, **changes}))
    return path


def driftscope(*args) -> subprocess.Popen:
    """``driftscope`` in a process of its own, importing this checkout's library."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    command = [sys.executable, "-m", "driftscope", *map(str, args)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, what: str, child: subprocess.Popen | None = None, seconds: float = 300) -> None:
    """Poll ``condition`` until it holds (the state a test goes on from), failing clearly if it never does."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert child is None or child.poll() is None, f"the child exited before {what}: {child.communicate()}"
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_12_run_exit_codes_and_every_parameter_error_before_any_model_loads(tmp_path, tiny_checkpoint_dir, capsys):
    # unknown runtime: found by the CLI before anything starts; nothing written
    params = write(tmp_path / "onnx.yaml", runtimes=["transformers:f32", "mlx:f32", "onnx:f32"])
    assert main(["run", str(params), "--out", str(tmp_path / "a")]) == 2
    assert "unknown runtime 'onnx'" in capsys.readouterr().err and not (tmp_path / "a" / "report.json").exists()
    # through the library: the report stops at the parameters step and no runtime has captured anything
    for runtimes, error, message in (
        (["transformers:f32", "mlx:f8"], RegistryError, "unknown precision policy 'f8'"),
        (
            ["transformers:f32", "mlx:f32", {"runtime": "mlx", "label": "p", "patch": "no_such_module_xyz:fn"}],
            HypothesisPatchError,
            "cannot import 'no_such_module_xyz'",
        ),
    ):
        out = tmp_path / f"lib-{len(runtimes)}"
        with pytest.raises(error, match=message):
            investigate(parse_parameters({**RUN, "name": "p", "runtimes": runtimes}, "test"), out)
        report = json.loads((out / "report.json").read_text())
        assert report["stopped_at"] == "parameters" and not (out / "taps").exists(), report["stopped_at"]
    # an investigation that fails is exit 2 whether or not notebooks are listed
    crash = {"runtime": "mlx", "policy": "f32", "patch": f"{PATCHES}:boom"}
    params = write(tmp_path / "crash.yaml", runtimes=["transformers:f32", crash])
    assert main(["run", str(params), "--out", str(tmp_path / "b")]) == 2
    assert "could not run: investigation: HypothesisPatchError" in capsys.readouterr().out


def test_13_a_patch_that_raises_is_named_and_its_traceback_kept_in_the_log(tmp_path, tiny_checkpoint_dir):
    crash = {"runtime": "mlx", "policy": "f32", "patch": f"{PATCHES}:boom"}
    with pytest.raises(HypothesisPatchError) as caught:
        investigate(parse_parameters({**RUN, "name": "p", "runtimes": ["transformers:f32", crash]}, "test"), tmp_path)
    assert caught.value.problem == f"patch {PATCHES}:boom raised RuntimeError: planted crash"
    assert "investigation.log" in caught.value.fix
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["error"] == {"type": "HypothesisPatchError", "message": str(caught.value)}
    logged = (tmp_path / "investigation.log").read_text()
    assert "Traceback (most recent call last)" in logged and 'raise RuntimeError("planted crash")' in logged


def test_17_the_directory_stays_locked_until_the_last_notebook_is_rendered(tmp_path, tiny_checkpoint_dir):
    """A run renders its notebooks in a process of its own after the verdict; while the second one is still to
    come (the first one's pages written), the directory is the run's: the lock is taken, naming the run's pid, and
    a second ``driftscope run --force`` into it stops (exit 2) without replacing the report."""
    from driftscope.run.runlock import BusyError, run_lock

    # the second notebook is 03 (the geometry reads the run's images): 02 would first capture a block's substages in
    # its kernel, importing torch and MLX there (~10 CPU-seconds), for a claim about the lock alone
    params = write(tmp_path / "locked.yaml", notebooks=["01_stage_parity", "03_window_geometry"])
    out = tmp_path / "out"
    first = driftscope("run", params, "--out", out)
    wait_for(lambda: (out / "01_stage_parity.nocode.html").exists(), "the first notebook's pages", first)
    assert not (out / "03_window_geometry.nocode.html").exists()
    with pytest.raises(BusyError) as taken:
        with run_lock(out):
            pass
    second = driftscope("run", params, "--out", out, "--force")
    err = second.communicate(timeout=120)[1]
    still_rendering = first.poll() is None
    assert first.wait(timeout=300) == 0, first.communicate()
    assert f"(pid {first.pid}) is writing to" in str(taken.value)
    assert second.returncode == 2 and "is writing to" in err, err
    assert still_rendering, "the run ended before the second one asked for the directory: the probe proved nothing"
    # the notebooks rendered the first run's report: the second run did not replace it under them
    assert json.loads((out / "report.json").read_text())["pid"] == first.pid
    assert (out / "03_window_geometry.nocode.html").exists()


def test_18_a_killed_run_is_recognised_as_dead_and_its_partial_files_are_removed(tmp_path, tiny_checkpoint_dir, capsys):
    from driftscope.views.run_state import stopped_at

    marker = tmp_path / "loading"
    hang = {
        "runtime": "mlx",
        "policy": "f32",
        "patch": {"callable": f"{PATCHES}:hang_once", "kwargs": {"marker": str(marker)}},
    }
    params = write(tmp_path / "killed.yaml", runtimes=["transformers:f32", hang])
    out = tmp_path / "out"
    child = driftscope("run", params, "--out", out)
    wait_for(marker.exists, "the run reached its MLX patch", child)  # after step capture:mlx:f32 was written
    child.send_signal(signal.SIGKILL)
    child.communicate()
    assert json.loads((out / "report.json").read_text())["status"] == "running"  # what the killed run left
    gone = f"stopped at capture:mlx:f32 (process {child.pid} is gone)"
    assert main(["show", str(out)]) == 2
    assert gone in capsys.readouterr().out
    (tmp_path / "c.yaml").write_text("default: {atol: 0.08}\n")
    assert main(["rejudge", str(out), "--contract", str(tmp_path / "c.yaml")]) == 2
    assert f"did not complete (dead: {gone})" in capsys.readouterr().err
    assert stopped_at(out / "report.json") == "capture:mlx:f32"  # `driftscope run` renders no further notebook
    # the next run (a notebook's reuse) says the last one died, runs it again, and cleans what a kill leaves: the
    # files named by the dead run's id (issue 49 item 10: by its id, never by a pattern)
    run_id = json.loads((out / "report.json").read_text())["run_id"]
    (out / "taps" / f"ghost.safetensors.{run_id}.partial").write_bytes(b"\0" * 64)
    (out / f".report.json.{run_id}-0badf00d.tmp").write_text("{")
    report = investigate(load_parameters(params), out, reuse=True)
    printed = capsys.readouterr().out
    assert f"died: {gone}; running it again" in printed and "removed 2 partial file(s)" in printed
    assert report.data["status"] == "complete" and report.verdict == "pass"
    assert not list(out.rglob("*.partial")) and not list(out.glob(".*.tmp"))


def test_49_10_a_run_removes_only_the_partial_files_its_killed_predecessor_wrote(tmp_path, tiny_checkpoint_dir):
    """``--out DIR`` holding a user's ``downloads/x.partial`` and another run's in-flight TapSet in a nested folder:
    neither is touched, whatever its name; a killed run's own leftovers (named by its id) are removed."""
    out = tmp_path / "out"
    theirs = {
        out / "downloads" / "x.partial": b"half a download",
        out / "downloads" / "x.partial.old": b"older",
        out / "nested" / "taps" / "mlx-f32.safetensors.partial": b"another run's capture",
        out / "nested" / ".report.json.1234abcd.tmp": b"another run's report",
        out / ".notes.tmp": b"mine",
        out / "taps" / "mlx-f32.safetensors.0123456789abcdef.partial": b"not a run this directory had",
    }
    for path, data in theirs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    params = write(tmp_path / "p.yaml")
    assert main(["run", str(params), "--out", str(out)]) == 0
    for path, data in theirs.items():
        assert path.read_bytes() == data, path
    # a run killed mid-write (its report still says running, its process gone) left files named by its id
    report = json.loads((out / "report.json").read_text())
    run_id = report["run_id"]
    (out / "report.json").write_text(json.dumps({**report, "status": "running", "pid": 2**22 + 7}))
    left = [out / "taps" / f"mlx-f32.safetensors.{run_id}.partial", out / f".report.json.{run_id}-00ff00ff.tmp"]
    for path in left:
        path.write_bytes(b"\0")
    assert main(["run", str(params), "--out", str(out)]) == 0
    assert not any(path.exists() for path in left)
    for path, data in theirs.items():
        assert path.read_bytes() == data, path


def test_49_12_a_patch_that_crashes_the_interpreter_costs_its_candidate_only(tmp_path, tiny_checkpoint_dir, capsys):
    """A candidate whose patch segfaults (a native crash) made `driftscope run` exit 139, its report left running
    and the other candidates unjudged. A patch from outside driftscope runs in a process of its own."""
    crash = {"runtime": "mlx", "policy": "f32", "label": "crash", "patch": f"{PATCHES}:segfault"}
    params = write(tmp_path / "crash.yaml", runtimes=["transformers:f32", "mlx:f32", crash])
    out = tmp_path / "out"
    assert main(["run", str(params), "--out", str(out)]) == 2  # a runtime could not run: not a pass, not a fail
    said = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "complete" and report["verdict"]["per_candidate"]["mlx:f32"] == "pass"
    assert report["verdict"]["per_candidate"]["crash"] == "could not run"
    (check,) = report["checks"]["crash"]
    assert "crashed its process (signal SIGSEGV)" in check["detail"] and "segfault" in check["detail"]
    assert "captured in a process of its own" in said


def test_49_12_show_into_a_reader_that_stops_reading_exits_with_the_verdict(tmp_path, tiny_checkpoint_dir):
    """``driftscope show RUN | head -1``: the reader goes away after one line; show exited 2 with a BrokenPipeError
    ("internal error"). The rest of the output is dropped and the exit code is the verdict's."""
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path / "p.yaml")), "--out", str(out)]) == 0
    for args in (["show", str(out)], ["diff", "x", "y", "--out-root", str(tmp_path / "none")]):
        read, written = os.pipe()
        os.close(read)  # a reader that stopped before the first line
        env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
        command = [sys.executable, "-m", "driftscope", *args]
        done = subprocess.run(command, stdout=written, stderr=subprocess.PIPE, text=True, env=env)
        os.close(written)
        assert "BrokenPipe" not in done.stderr and "internal error" not in done.stderr, done.stderr
        assert done.returncode == (0 if args[0] == "show" else 2), (args, done.returncode, done.stderr)
