"""The notebook thread and the investigation never compile at once (issue 30 item 12): ``driftscope run`` stopped
at inputs with "SystemError: AST constructor recursion depth mismatch" twice in nine runs on a busy machine, the
notebook thread importing papermill/nbconvert while the investigation imported transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from conftest import ROOT, write_params

STACK_CHECK = """
import json, sys
from driftscope.views import render
render.prepare_notebook_thread(["01_stage_parity", "no_such_notebook"])
print(json.dumps({"missing": [m for m in render.NOTEBOOK_STACK if m not in sys.modules],
                  "frameworks": [m for m in ("torch", "transformers", "mlx", "jax") if m in sys.modules]}))
"""


def test_the_notebook_stack_is_ready_before_the_thread_and_no_framework_is_imported_for_it():
    done = subprocess.run([sys.executable, "-c", STACK_CHECK], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"missing": [], "frameworks": []}


def test_the_thread_starts_only_after_the_stack_is_prepared(monkeypatch, tmp_path):
    from driftscope.run import investigation
    from driftscope.views import render

    events = []
    monkeypatch.setattr(render, "prepare_notebook_thread", lambda names: events.append(("prepare", tuple(names))))
    real_start = threading.Thread.start

    def start(thread):
        events.append(("start", thread.name))
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(investigation, "investigate", lambda *args, **kwargs: events.append(("investigate",)))
    params = SimpleNamespace(notebooks=())
    errors = render.investigate_and_render(params, tmp_path / "p.yaml", tmp_path / "out", True, tmp_path, print)
    assert errors == {}
    assert events[:3] == [("prepare", ()), ("start", "driftscope-notebooks"), ("investigate",)]


def test_a_notebook_thread_that_dies_is_an_error_not_a_pass(monkeypatch, tmp_path):
    """Issue 30 item 8: the thread died with a traceback and the run exited 0 with no notebook rendered."""
    from driftscope.run import investigation
    from driftscope.views import render

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for /: 'PosixPath' and 'int'")

    monkeypatch.setattr(render, "run_notebooks", broken)
    monkeypatch.setattr(investigation, "investigate", lambda *args, **kwargs: None)
    errors = render.investigate_and_render(
        SimpleNamespace(notebooks=("01_stage_parity",)), tmp_path / "p.yaml", tmp_path / "out", True, tmp_path, print
    )
    assert errors == {"notebooks": "TypeError: unsupported operand type(s) for /: 'PosixPath' and 'int'"}


@pytest.mark.slow
def test_runs_beside_a_cpu_hog_never_hit_the_compile_race(tmp_path, tiny_checkpoint_dir):
    """Six `driftscope run`s of two runtimes and notebook 01, two busy-looping processes beside them."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        for index in range(6):
            params = write_params(tmp_path / f"p{index}.yaml", f"race-{index}", ["transformers:f32", "mlx:f32"])
            done = subprocess.run(
                [sys.executable, "-m", "driftscope", "run", str(params), "--out", str(tmp_path / f"out{index}")],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            assert "SystemError" not in done.stdout + done.stderr
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    finally:
        for hog in hogs:
            hog.kill()
