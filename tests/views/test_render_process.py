"""The render process (issue 38 item 3): its warm kernel renders what a cold one renders, and a render process
that dies is an error of the run, never a pass."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from render import copy_run, differences, notebook_text, render  # noqa: E402


@pytest.mark.slow  # two renders of notebook 01: 34 s at load 1-2
def test_a_warm_kernel_renders_what_a_cold_one_renders(rendered_copy, tmp_path):
    """The same finished run rendered both ways while the run's lock is held, then released (the verdict): the
    way ``driftscope run`` rendered before (papermill's own kernel started in a thread of the run's process, every
    cell run after the report) and the render process (its kernel warmed before); the executed notebook, its HTML
    and its no-code HTML say the same, cell by cell (timings and ids aside)."""
    _, run = rendered_copy
    params = run.parent / "p.yaml"
    runs = {kind: copy_run(run, tmp_path, kind) for kind in ("before", "after")}
    for kind, out in runs.items():
        render(out, params, "01_stage_parity", 0.5, kind)
    assert differences(runs["before"], runs["after"], "01_stage_parity") == []
    cells = notebook_text(runs["after"] / "01_stage_parity.ipynb")
    counts = [cell["count"] for cell in cells if cell["type"] == "code"]
    assert counts == list(range(1, len(counts) + 1))  # the warm-up is not a cell: the first one is In [1]
    page = (runs["after"] / "01_stage_parity.nocode.html").read_text()
    assert "Verdict: FAIL" in page and "Progress log" in page


def test_a_render_process_that_dies_is_an_error_not_a_pass(tmp_path):
    """Killed while its kernel waits for the report: the run gets the error (issue 30 item 8: a notebook thread
    died with a traceback and the run exited 0 with no notebook rendered)."""
    from driftscope.run.runlock import result_lock, run_lock
    from driftscope.views.render_process import KERNEL_PIDS, RenderProcess

    out = tmp_path / "out"
    out.mkdir()
    logged = []
    with run_lock(out), result_lock(out):
        params = ROOT / "parameters" / "demo_shapes.yaml"
        process = RenderProcess.start(["01_stage_parity"], out, params, ROOT, logged.append)
        pids = process.scratch / KERNEL_PIDS
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)  # the kernel it started, recorded after its connection file was written
        assert list(process.scratch.glob("*.json")), "the kernel wrote no connection file in the scratch folder"
        kernel = int(pids.read_text().split()[0])
        assert os.getpgid(kernel) == kernel  # a session of its own: SIGKILL to the render process does not reach it
        process.process.send_signal(signal.SIGKILL)
        errors = process.wait()
    assert errors == {"notebooks": "the render process exited with code -9 before its notebooks were rendered"}
    assert logged == [f"the notebooks could not render: {errors['notebooks']}"]
    # the orphaned kernel is ended (still starting, it would write its connection file into the folder again)
    assert not _alive(kernel)
    assert not process.scratch.exists()  # the killed process could not remove its kernel's connection file


STACK_CHECK = """
import json, sys, time
from pathlib import Path
from driftscope.views import preimport
from driftscope.views.render_process import RenderProcess
process = RenderProcess.start(["01_stage_parity"], Path(sys.argv[1]), Path(sys.argv[2]), Path.cwd(), print)
process.stop()
stack = [m for m in preimport.NOTEBOOK_STACK + ("IPython", "matplotlib", "pandas") if m in sys.modules]
print(json.dumps({"imported": stack}))
"""


def test_the_run_process_imports_no_notebook_stack(tmp_path):
    """The notebooks' stack (papermill, nbclient, nbconvert, jinja2, ...) is the render process's: the process that
    runs the investigation imports none of it on the way to its first capture."""
    done = subprocess.run(
        [sys.executable, "-c", STACK_CHECK, str(tmp_path), str(ROOT / "parameters/demo_shapes.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"imported": []}


ORPHANED = """
import os, sys, time
from pathlib import Path
from driftscope.run.runlock import result_lock, run_lock
from driftscope.views.render_process import RenderProcess
out = Path(sys.argv[1])
with run_lock(out), result_lock(out):
    process = RenderProcess.start(["01_stage_parity"], out, Path(sys.argv[2]), Path.cwd(), print)
    print(process.process.pid, process.scratch, flush=True)
    time.sleep(float(sys.argv[3]))
    os._exit(9)  # killed: no handler runs, the locks go with the process
"""


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_run_leaves_no_render_process_to_run_it_again(tmp_path):
    """The run dies while its notebook's kernel waits for the lock: the render process ends with it (else the
    kernel, its parent alive, would take the freed lock and run the whole investigation again)."""
    out = tmp_path / "out"
    out.mkdir()
    params = ROOT / "parameters" / "demo_shapes.yaml"
    done = subprocess.run(
        [sys.executable, "-c", ORPHANED, str(out), str(params), "3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    pid, scratch = int(done.stdout.split()[0]), Path(done.stdout.split()[1])
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid)
    time.sleep(2)
    assert not (out / "report.json").exists()  # nobody ran the investigation
    assert not scratch.exists()  # the render process removed its temporary files on its way out
