"""MLX's CPU matmuls run on OpenBLAS (loaded by driftscope), not the wheel's reference BLAS."""

from __future__ import annotations

import numpy as np


def test_mlx_runtime_reports_openblas_and_matmuls_stay_exact(tiny_checkpoint):
    from driftscope.runtimes import get_runtime

    runtime = get_runtime("mlx")(tiny_checkpoint, "f32")
    runtime.load()
    assert runtime.versions()["blas"].startswith("openblas ("), runtime.versions()["blas"]
    import mlx.core as mx

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 80)).astype(np.float32)
    np.testing.assert_allclose(np.array(mx.array(a) @ mx.array(b)), a @ b, rtol=1e-5, atol=1e-4)
