"""Reuse of a finished run (issue 49 items 1 and 2): a report stands for a parameter file only when it was judged
under the file's contract and runtimes, on the bytes the file names today. ``driftscope run``, a notebook's
``investigate(reuse=True)`` and a batch's reuse all ask ``run.reuse.stale_reason``; each case failed before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from conftest import TINY, write_params
from driftscope.batch.worker import _reusable
from driftscope.cli import main
from driftscope.core.storage import OutputRoot
from driftscope.run.investigation import investigate
from driftscope.run.params import load_parameters
from driftscope.run.reuse import PACKAGE_DIR


def write(path: Path, runtimes=("transformers:f32", "mlx:f32"), **fields) -> Path:
    return write_params(path, path.stem, list(runtimes), stages={"blocks": True}, replay=False, notebooks=[], **fields)


def run(capsys, params: Path, out: Path) -> tuple[int, str]:
    code = main(["run", str(params), "--out", str(out)])
    return code, capsys.readouterr().out


def batch_reuses(params: Path, out: Path) -> bool:
    """Whether a batch would reuse the run in ``out`` (laid out as ``<root>/<commit>/<run>``)."""
    found = _reusable(
        OutputRoot(str(out.parent.parent)), out.parent.name, out.name, load_parameters(params), PACKAGE_DIR
    )
    return found is not None


def test_49_1_a_run_rejudged_in_place_under_a_looser_contract_is_not_reused_as_a_pass(tmp_path, capsys):
    strict, loose = tmp_path / "strict.yaml", tmp_path / "loose.yaml"
    strict.write_text("default: {atol: 1.0e-4, rtol: 1.0e-4}\n")
    loose.write_text("default: {atol: 0.5, rtol: 0.5}\n")
    params = write(tmp_path / "p.yaml", ["transformers:f32", "mlx:f16"], contract=str(strict))
    out = tmp_path / "root" / "c0mmit" / "p"
    assert run(capsys, params, out)[0] == 1  # f16 against f32 under 1e-4: fails

    def loosen() -> None:
        assert main(["rejudge", str(out), "--contract", str(loose)]) == 0  # no --out: in place, now a pass
        capsys.readouterr()

    loosen()
    assert not batch_reuses(params, out)
    code, said = run(capsys, params, out)
    assert code == 1 and "judged under another contract" in said and "re-judged from" in said
    assert json.loads((out / "report.json").read_text())["contract"]["default"]["atol"] == 1e-4
    loosen()
    assert investigate(load_parameters(params), out, reuse=True).verdict == "fail"  # a notebook's reuse
    # the same report judged under the file's own contract again (rejudge with it) is reused
    assert main(["rejudge", str(out), "--contract", str(strict)]) == 1
    capsys.readouterr()
    assert batch_reuses(params, out)
    code, said = run(capsys, params, out)
    assert code == 1 and "reusing the finished run" in said


def _rewrite_in_place(path: Path, change) -> None:
    """``path``'s bytes changed by ``change`` at the same path, inode, size and modification time (``cp -p``)."""
    before = path.stat()
    data = change(bytearray(path.read_bytes()))
    assert len(data) == before.st_size
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
    import os

    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _data_offset(path: Path, name: str) -> int:
    """Where tensor ``name``'s bytes start in a safetensors file."""
    import struct

    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return 8 + length + json.loads(raw[8 : 8 + length])[name]["data_offsets"][0]


def test_49_2_a_finished_run_is_not_reused_once_the_checkpoint_or_a_tap_file_changed(tmp_path, capsys):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(TINY, checkpoint)
    params = write(tmp_path / "p.yaml", checkpoint=str(checkpoint))
    out = tmp_path / "root" / "c0mmit" / "p"
    assert run(capsys, params, out)[0] == 0
    code, said = run(capsys, params, out)
    assert code == 0 and "reusing the finished run" in said and batch_reuses(params, out)

    # an external engine's TapSet: the MLX run's own, imported; then rewritten at the same path
    engine = tmp_path / "engine.safetensors"
    shutil.copyfile(out / "taps" / "mlx-f32.safetensors", engine)
    shutil.copyfile(out / "taps" / "mlx-f32.json", tmp_path / "engine.json")
    tapfile = {"runtime": "tapfile", "policy": "f32", "label": "engine", "options": {"path": str(engine)}}
    imported = write(tmp_path / "q.yaml", ["transformers:f32", tapfile], checkpoint=str(checkpoint))
    other = tmp_path / "root" / "c0mmit" / "q"
    assert run(capsys, imported, other)[0] == 0
    offset = _data_offset(engine, "vision.block.1")

    def shift(data: bytearray) -> bytearray:
        values = np.frombuffer(bytes(data[offset : offset + 64]), dtype=np.float32) + np.float32(10.0)
        data[offset : offset + 64] = values.tobytes()
        return data

    _rewrite_in_place(engine, shift)
    assert not batch_reuses(imported, other)
    code, said = run(capsys, imported, other)
    assert code == 1 and "an external engine's TapSet changed since it ran" in said

    # the checkpoint's weights rewritten in place (NaN), its modification time restored
    weights = sorted(checkpoint.glob("*.safetensors"))[0]

    def poison(data: bytearray) -> bytearray:
        tail = len(data) - 4096
        data[tail:] = np.full(1024, np.nan, dtype=np.float32).tobytes()
        return data

    _rewrite_in_place(weights, poison)
    assert not batch_reuses(params, out)
    code, said = run(capsys, params, out)
    assert "the checkpoint's content changed since it ran" in said and code != 0, said


def test_the_code_digest_changes_with_the_code_not_with_the_labs_copies_beside_it(tmp_path):
    """A notebook saved in the lab leaves ``.ipynb_checkpoints`` beside the package's notebooks: not code, so a
    finished run stays reusable; a changed module is code."""
    from driftscope.run.reuse import code_digest

    package = tmp_path / "driftscope"
    (package / "notebooks").mkdir(parents=True)
    (package / "core.py").write_text("X = 1\n")
    (package / "notebooks" / "01.ipynb").write_text("{}")
    before = code_digest(package)
    (package / "notebooks" / ".ipynb_checkpoints").mkdir()
    (package / "notebooks" / ".ipynb_checkpoints" / "01-checkpoint.ipynb").write_text("{}")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    assert code_digest(package) == before
    (package / "core.py").write_text("X = 2\n")
    assert code_digest(package) != before
    (package / "core.py").write_text("X = 1\n")
    (package / "notebooks" / "01.ipynb").write_text('{"cells": []}')
    assert code_digest(package) != before
