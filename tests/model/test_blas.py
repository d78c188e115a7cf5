"""MLX's CPU matmuls run on OpenBLAS (loaded by driftscope), not the wheel's reference BLAS."""

from __future__ import annotations

import numpy as np


def test_mlx_runtime_reports_openblas_and_matmuls_stay_exact(tiny_checkpoint):
    from driftscope.capture.runtimes import get_runtime

    runtime = get_runtime("mlx")(tiny_checkpoint, "f32")
    runtime.load()
    assert runtime.versions()["blas"].startswith("openblas ("), runtime.versions()["blas"]
    import mlx.core as mx

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 80)).astype(np.float32)
    np.testing.assert_allclose(np.array(mx.array(a) @ mx.array(b)), a @ b, rtol=1e-5, atol=1e-4)


def test_openblas_for_mlx_leaves_torch_its_own_blas():
    """Loading OpenBLAS globally before torch made torch bind its matmuls to it (5x slower); in a fresh process
    driftscope imports torch first, and torch's matmuls still agree with numpy's."""
    import subprocess
    import sys

    script = (
        "import sys; from driftscope.model.blas import mlx_blas; blas = mlx_blas(); "
        "print(blas.startswith('openblas'), 'torch' in sys.modules); "
        "import torch, numpy as np; a = np.random.default_rng(0).standard_normal((64, 96), dtype=np.float32); "
        "print(float(np.abs((torch.from_numpy(a) @ torch.from_numpy(a.T)).numpy() - a @ a.T).max()))"
    )
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert lines[:2] == ["True", "True"], lines
    assert float(lines[2]) < 1e-3
