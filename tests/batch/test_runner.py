"""Batches refused before any run starts (batch.runner): an output root no later process can read (memory://, issue
49 item 11), one this user cannot write (item 12: it was an internal error), and ``--jobs 0`` (item 13)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY
from driftscope.batch.runner import run_batch
from driftscope.cli import main
from driftscope.core.storage import StorageError
from driftscope.errors import ParameterError


@pytest.fixture
def params(tmp_path) -> Path:
    path = tmp_path / "p.yaml"
    data = {
        "checkpoint": str(TINY),
        "images": [str(ROOT / "fixtures" / "images" / "checkerboard_140.png")],
        "runtimes": ["transformers:f32", "mlx:f32"],
        "notebooks": [],
    }
    path.write_text(yaml.safe_dump(data))
    return path


def batch(capsys, params: Path, *args: str) -> tuple[int, str]:
    code = main(["batch", str(params), *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_49_11_an_output_root_in_memory_is_refused_without_a_scheduler_too(params, capsys):
    with pytest.raises(ParameterError, match="keeps the outputs in memory"):
        run_batch([params], out_root="memory://x", log=lambda message: None)
    code, said = batch(capsys, params, "--out-root", "memory://x")
    assert code == 2 and "vanish with the process" in said and "pass" not in said.split("fix:")[0]


def test_49_12_an_output_root_that_cannot_be_written_is_said_plainly(params, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    for root in (tmp_path / "file" / "runs", Path("/proc/driftscope-runs")):
        with pytest.raises(StorageError, match=f"cannot keep outputs under {root}"):
            run_batch([params], out_root=root, log=lambda message: None)
        code, said = batch(capsys, params, "--out-root", str(root))
        assert code == 2 and "driftscope: error: cannot keep outputs" in said, said
        assert "internal error" not in said and "Traceback" not in said


def test_49_13_a_batch_of_no_jobs_at_a_time_is_refused(params, tmp_path, capsys):
    for jobs in ("0", "-2"):
        code, said = batch(capsys, params, "--jobs", jobs, "--out-root", str(tmp_path / "out"))
        assert code == 2 and "at least one run at a time" in said
    assert not (tmp_path / "out").exists()
