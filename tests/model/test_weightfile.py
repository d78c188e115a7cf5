"""Checkpoint tensors read by driftscope.model.weightfile equal what the safetensors library itself reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from driftscope.errors import CheckpointError
from driftscope.model import weightfile
from driftscope.model.weightfile import ALIGNMENT, TensorFiles, half_reads
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
    files = TensorFiles(tmp_path)
    np.testing.assert_array_equal(files.read_rows("w", [3, 0]), np.ones((2, 64), dtype=np.float32))  # whole rows
    with pytest.raises(CheckpointError, match="ends inside 'w'"):
        files.read_rows("w", [0, 63])  # the last row is cut
    with pytest.raises(CheckpointError, match="'w' has 64 rows: no row 64"):
        files.read_rows("w", [64])


def test_a_widened_read_goes_a_chunk_at_a_time_and_equals_torchs_conversion(tmp_path, monkeypatch):
    """bfloat16 widened to float32, and rounded to float16 under ``half_reads``, across chunk boundaries (the last
    one partial), without ever a float32 (or stored) copy of the whole tensor besides the result: numpy's own
    allocations during the read (tracemalloc sees them; the result is a mapping of its own) stay chunk-sized."""
    import tracemalloc

    generator = torch.Generator().manual_seed(1)
    tensors = {"big": torch.randn(1 << 10, 1 << 12, generator=generator).bfloat16(), "odd": torch.randn(50).bfloat16()}
    save_file(tensors, tmp_path / "model.safetensors")
    monkeypatch.setattr(weightfile, "CHUNK", 1 << 14)
    files = TensorFiles(tmp_path)
    tracemalloc.start()
    try:
        big = files.read("big")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert big.nbytes == 16 << 20 and peak < 1 << 20, peak  # 16 MiB read; a whole-tensor temporary is >= 8 MiB
    np.testing.assert_array_equal(big, tensors["big"].float().numpy())
    monkeypatch.setattr(weightfile, "CHUNK", 7)  # 50 elements: 7 full chunks and one of 1
    np.testing.assert_array_equal(files.read("odd"), tensors["odd"].float().numpy())
    with half_reads(tmp_path, ["odd", "big"]):
        odd, half = files.read("odd"), files.read("big")
    assert odd.dtype == half.dtype == np.float16
    np.testing.assert_array_equal(odd, tensors["odd"].half().numpy())  # torch rounds bf16 -> f16 to nearest even
    np.testing.assert_array_equal(half, tensors["big"].half().numpy())
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-30])  # inside the last tensor's third-last chunk
    with pytest.raises(CheckpointError, match="ends inside"):
        TensorFiles(tmp_path).read(max(tensors, key=lambda n: TensorFiles(tmp_path).entries[n].start))


def test_no_weights_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        TensorFiles(tmp_path)
