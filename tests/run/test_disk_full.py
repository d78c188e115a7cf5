"""A full disk (issue 30 item 10): nothing stays truncated under its final name, and the report says which file
and which errno stopped the run (it stayed ``running`` and the message contradicted itself)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import SHAPES, write_params
from driftscope.cli import main


@pytest.fixture
def small_disk(tmp_path):
    """A 5 MB tmpfs (root only, as CI and this machine run: skipped where it cannot be mounted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_run_on_a_full_disk_keeps_no_truncated_file_and_says_where_it_stopped(small_disk, tmp_path, capsys):
    params = write_params(tmp_path / "p.yaml", "full", ["transformers:f32", "mlx:f32"], images=[str(SHAPES)])
    out = small_disk / "out"
    assert main(["run", str(params), "--out", str(out)]) == 2
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "error" and report["stopped_at"].startswith("capture:")
    assert report["error"]["type"] == "OutputError" and report["error"]["errno"] == 28
    assert report["error"]["path"].endswith(".safetensors")
    assert "No space left on device" in report["error"]["message"]
    leftovers = sorted(p.name for p in (out / "taps").rglob("*") if p.is_file())
    for name in leftovers:  # a TapSet file is there only complete, with its sidecar
        if name.endswith(".safetensors"):
            assert name.removesuffix(".safetensors") + ".json" in leftovers
    assert not [name for name in leftovers if name.endswith((".partial", ".old"))], leftovers
