"""MLX CPU matmul speed: the wheel's bundled reference BLAS against OpenBLAS, side by side in one run.

    .venv/bin/python benchmarks/mlx_blas.py

Each BLAS runs in a fresh interpreter (it must be chosen before mlx.core is imported); the same
f32 GEMMs as one ViT block of the 3B tower on 1024 patches (qkv, proj, gate, up, down) and an f16
one (MLX's CPU f16 matmul does not use BLAS at all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CODE = r"""
import json, sys, time, numpy as np
from driftscope.model.blas import mlx_blas
blas = mlx_blas()
import mlx.core as mx
shapes = [(1024, 1280, 3840), (1024, 1280, 1280), (1024, 1280, 3420), (1024, 1280, 3420), (1024, 3420, 1280)]
rng = np.random.default_rng(0)
out = {"blas": blas}
for dtype in ("float32", "float16"):
    cast = getattr(mx, dtype)
    pairs = [(mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(cast),
              mx.array(rng.standard_normal((k, n)).astype(np.float32)).astype(cast)) for m, k, n in shapes]
    mx.eval(*[x for p in pairs for x in p])
    mx.eval(pairs[0][0] @ pairs[0][1])
    start = time.perf_counter()
    for a, b in pairs:
        mx.eval(a @ b)
    seconds = time.perf_counter() - start
    flops = sum(2 * m * k * n for m, k, n in shapes)
    out[dtype] = {"seconds": seconds, "gflops": flops / seconds / 1e9}
print(json.dumps(out))
"""


def run(setting: str) -> dict:
    env = dict(os.environ, DRIFTSCOPE_MLX_BLAS=setting) if setting else dict(os.environ)
    env.pop("DRIFTSCOPE_MLX_BLAS", None) if not setting else None
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    bundled, openblas = run("bundled"), run("")
    print("| BLAS | f32 block GEMMs s | f32 GFLOP/s | f16 block GEMMs s | f16 GFLOP/s |")
    print("|---|---|---|---|---|")
    for result in (bundled, openblas):
        print(
            f"| {result['blas']} | {result['float32']['seconds']:.2f} | {result['float32']['gflops']:.1f} | "
            f"{result['float16']['seconds']:.2f} | {result['float16']['gflops']:.1f} |"
        )
    print(
        f"\nf32 speed-up with OpenBLAS: {bundled['float32']['seconds'] / openblas['float32']['seconds']:.1f}x; "
        f"f16 (no BLAS either way): {bundled['float16']['seconds'] / openblas['float16']['seconds']:.2f}x"
    )
