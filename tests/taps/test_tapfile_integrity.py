"""Tap files and checkpoints that lie in their headers are refused by name; a tensor of another shape is a shape
mismatch, not elements over tolerance (issue 30 items 14 and 17)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from driftscope.errors import CheckpointError, TapFileError
from driftscope.families.checkpoints import open_checkpoint
from driftscope.judge.contract import Contract
from driftscope.judge.verdict import judge
from driftscope.taps.tapset import TapSet, TapWriter


def write_safetensors(path, header_json: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header_json)) + header_json + data)


def engine(tmp_path, name: str, arrays: dict) -> TapSet:
    with TapWriter(tmp_path / name, {"runtime": "engine", "label": name}) as writer:
        for stage_id, value in arrays.items():
            writer.add(stage_id, value)
    return TapSet(writer.tensor_path)


def test_a_stage_listed_twice_in_the_header_is_refused(tmp_path):
    honest = engine(tmp_path, "honest", {"vision.block.0": np.ones((4, 2), np.float32)})
    raw = honest.tensor_path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + length].decode().rstrip()
    entry = json.dumps({"dtype": "F32", "shape": [4, 2], "data_offsets": [0, 32]})
    forged = header[:1] + f'"vision.block.0": {entry},' + header[1:]  # a first entry, then the honest one
    write_safetensors(honest.tensor_path, forged.encode(), raw[8 + length :])
    with pytest.raises(TapFileError, match="'vision.block.0' is listed twice"):
        TapSet(honest.tensor_path)


def test_a_stage_listed_twice_in_the_sidecar_is_refused(tmp_path):
    honest = engine(tmp_path, "honest", {"vision.block.0": np.ones((4, 2), np.float32)})
    text = honest.sidecar_path.read_text()
    stages = text.index('"stages": {') + len('"stages": {')
    honest.sidecar_path.write_text(text[:stages] + '"vision.block.0": {"shape": [9]},' + text[stages:])
    with pytest.raises(TapFileError, match="listed twice"):
        TapSet(honest.tensor_path)


def test_a_header_length_past_the_file_is_named(tmp_path, tiny_checkpoint_dir):
    import shutil

    target = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint_dir, target)
    weights = target / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(struct.pack("<Q", 2**62) + raw[8:])
    with pytest.raises(CheckpointError, match=r"header length says 4611686018427387904 bytes") as err:
        open_checkpoint(target)
    assert "model.safetensors" in err.value.problem


@pytest.mark.parametrize("shape", [(0, 8), (8, 16)])
def test_a_tensor_of_another_shape_is_a_shape_mismatch(tmp_path, shape):
    """Zero-size and transposed candidates: the verdict names a shape mismatch, not "N/N elements over tolerance"."""
    reference = engine(tmp_path, "ref", {"vision.block.0": np.ones((16, 8), np.float32)})
    candidate = engine(tmp_path, "cand", {"vision.block.0": np.ones(shape, np.float32)})
    result = judge(reference, [candidate], Contract(), _plan())
    (reason,) = [r for r in result["verdict"]["reasons"] if "first divergence" in r]
    assert "shape mismatch: shapes differ: reference [16, 8] vs candidate" in reason, reason
    assert "elements over tolerance" not in reason


def _plan():
    from driftscope.taps.stages import Stage, StagePlan

    return StagePlan("engine", [Stage("vision.block.0", ("tokens", "channels"), block=0)], depth=1)
