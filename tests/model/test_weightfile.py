"""Checkpoint tensors read by driftscope.model.weightfile equal what the safetensors library itself reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from driftscope.errors import CheckpointError
from driftscope.model.weightfile import ALIGNMENT, TensorFiles
from safetensors.torch import save_file


def test_reads_every_dtype_exactly_and_aligned(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.f32": torch.randn(7, 13, generator=generator),
        "b.f16": torch.randn(5, 3, generator=generator).half(),
        "c.bf16": torch.randn(33, generator=generator).bfloat16(),
        "d.scalar": torch.tensor(2.5),
    }
    save_file(dict(list(tensors.items())[:2]), tmp_path / "model-00001.safetensors")
    save_file(dict(list(tensors.items())[2:]), tmp_path / "model-00002.safetensors")
    files = TensorFiles(tmp_path)
    assert sorted(files.names()) == sorted(tensors)
    for name, tensor in tensors.items():
        got = files.read(name)
        assert got.dtype == np.float32 and got.shape == tuple(tensor.shape)
        assert got.ctypes.data % ALIGNMENT == 0 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, tensor.float().numpy())


def test_truncated_file_is_named(tmp_path):
    save_file({"w": torch.ones(64, 64)}, tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="ends inside 'w'"):
        TensorFiles(tmp_path).read("w")


def test_no_weights_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        TensorFiles(tmp_path)
