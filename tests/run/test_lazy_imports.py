"""Start-up stays cheap: the reading commands import no ML framework, and ``driftscope run`` imports each
framework only when the runtime that needs it is first used (issue 38, item 2).

Each command runs in a fresh interpreter through ``benchmarks/startup.py --probe``, which prints after every
log line (and at exit) which of torch, transformers, mlx, mlx_vlm, jax, jaxlib and iree are in ``sys.modules``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, write_params

sys.path.insert(0, str(ROOT / "benchmarks"))

from startup import FRAMEWORKS, PROBE, probe_command  # noqa: E402


def probed(*argv: str) -> tuple[int, list[tuple[set[str], str]]]:
    """(exit code, [(frameworks imported, log message)]) of ``driftscope argv`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    done = subprocess.run(probe_command(list(argv)), capture_output=True, text=True, env=env, timeout=600)
    lines = []
    for line in done.stdout.splitlines():
        if line.startswith(PROBE):
            names, _, message = line.removeprefix(PROBE).partition(" | ")
            lines.append((set(names.split()) - {"-"}, message))
    assert lines and lines[-1][1].startswith("exit "), done.stdout + done.stderr
    return done.returncode, lines


def at(lines, prefix: str) -> set[str]:
    """The frameworks imported when the first message starting with ``prefix`` was logged."""
    return next(names for names, message in lines if message.strip().startswith(prefix))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_checkpoint_dir):
    """A finished run of transformers, MLX and JAX (no notebooks), under ``<root>/<commit>/lazy``, probed."""
    base = tmp_path_factory.mktemp("lazy")
    params = write_params(
        base / "p.yaml", "lazy", ["transformers:f32", "mlx:f32", "jax:f32"], stages={"blocks": True}, notebooks=[]
    )
    out = base / "root" / "aaaa00000000" / "lazy"
    code, lines = probed("run", str(params), "--out", str(out))
    assert code == 0, lines
    shutil.copytree(out.parent, base / "root" / "bbbb00000000")  # a second commit for `diff`
    return out, lines


def test_run_imports_each_framework_when_its_runtime_is_first_used(finished):
    _, lines = finished
    assert at(lines, "run lazy") == set()  # parameters read, checkpoint not yet opened
    # the inputs are prepared in NumPy and PIL; the oracle's runtime is transformers': torch comes with it
    assert at(lines, "capture transformers:f32") == set()
    assert at(lines, "capture mlx:f32") == {"torch", "transformers"}
    assert {"mlx", "mlx_vlm"} <= at(lines, "mlx:f32: done in")
    assert not {"jax", "jaxlib"} & at(lines, "capture jax:f32")
    assert {"jax", "jaxlib"} <= at(lines, "jax:f32: done in")
    assert "iree" not in lines[-1][0]  # the jax runtime runs the StableHLO on XLA: IREE is never imported
    assert at(lines, "verdict") <= set(FRAMEWORKS)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["show", "{run}"],
        ["rejudge", "{run}", "--contract", "parameters/contracts/strict.yaml", "--out", "{tmp}/strict.json"],
        ["diff", "aaaa00000000", "bbbb00000000", "--out-root", "{root}"],
    ],
    ids=["help", "run-help", "show", "rejudge", "diff"],
)
def test_reading_commands_import_no_ml_framework(finished, tmp_path, argv):
    out, _ = finished
    argv = [a.format(run=out, root=out.parent.parent, tmp=tmp_path) for a in argv]
    code, lines = probed(*argv)
    assert code in (0, 1), lines
    assert lines[-1][0] == set(), f"driftscope {' '.join(argv)} imported {sorted(lines[-1][0])}"
    if argv[0] == "rejudge":  # it really re-judged the saved taps under the strict contract
        assert (tmp_path / "strict.json").exists()
