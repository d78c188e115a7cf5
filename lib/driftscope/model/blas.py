"""Give MLX's CPU backend an optimized BLAS.

The ``mlx[cpu]`` wheel links a bundled reference BLAS (``libblas-*.so.3.10``): an f32 GEMM of a
ViT block runs ~50x slower than OpenBLAS (see docs/benchmarks.md). Loading a system OpenBLAS
with ``RTLD_GLOBAL`` before ``mlx.core`` is first imported makes MLX's ``cblas_sgemm`` resolve to
it. ``DRIFTSCOPE_MLX_BLAS`` names another library, or ``bundled`` to keep the reference BLAS.

torch is imported first when it is installed: a library loaded afterwards binds its BLAS symbols to the
first global definition, so torch imported after OpenBLAS ran its f32 matmuls through it at ~50 GFLOP/s
instead of MKL's ~200 on this machine (a 3B-shaped transformers forward 3-4x slower; docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)
_state: dict[str, str] = {}


def mlx_blas() -> str:
    """Load the optimized BLAS once (before mlx.core); returns what MLX's matmuls will use."""
    if "blas" in _state:
        return _state["blas"]
    wanted = os.environ.get("DRIFTSCOPE_MLX_BLAS", "")
    if wanted == "bundled":
        _state["blas"] = "bundled reference BLAS (DRIFTSCOPE_MLX_BLAS=bundled)"
    elif "mlx.core" in sys.modules:
        _state["blas"] = "unknown (mlx.core was imported before driftscope could load OpenBLAS)"
    else:
        path = next((p for p in ([wanted] if wanted else CANDIDATES) if p and Path(p).exists()), None)
        if path is None:
            _state["blas"] = "bundled reference BLAS (no OpenBLAS found: `make setup` installs libopenblas0-pthread)"
        else:
            _bind_torch_first()
            ctypes.CDLL(path, mode=os.RTLD_NOW | ctypes.RTLD_GLOBAL)
            _state["blas"] = f"openblas ({path})"
    return _state["blas"]


def _bind_torch_first() -> None:
    """Import torch (if installed) before OpenBLAS enters the global symbol scope, so torch's own BLAS (MKL)
    keeps its matmuls; torch's extension is loaded with RTLD_NOW, so every symbol binds at import."""
    import importlib.util

    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401
