"""Two threads never compile at once (issue 30 item 12): ``driftscope run`` stopped at inputs with "SystemError: AST
constructor recursion depth mismatch" twice in nine runs on a busy machine, a notebook thread importing
papermill/nbconvert while the investigation imported transformers. The notebooks now render in a process of their
own (``views.render_process``), which imports its whole stack before its one other thread (the next kernel's
warm-up) starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, write_params

STACK_CHECK = """
import json, sys
from driftscope.views import preimport
preimport.prepare_notebook_stack(["01_stage_parity", "no_such_notebook"])
print(json.dumps({"missing": [m for m in preimport.NOTEBOOK_STACK if m not in sys.modules],
                  "frameworks": [m for m in ("torch", "transformers", "mlx", "jax") if m in sys.modules]}))
"""


def test_the_render_process_stack_is_ready_before_its_kernel_thread_and_no_framework_is_imported_for_it():
    done = subprocess.run([sys.executable, "-c", STACK_CHECK], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"missing": [], "frameworks": []}


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
