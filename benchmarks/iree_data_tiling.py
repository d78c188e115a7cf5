"""IREE's whole 3B forward (tower, prefill, 8 greedy tokens) compiled without and with ``--iree-opt-data-tiling``,
alternating (issue 37 item 6). Since the measurement, graphs of at least ``capture.iree.DATA_TILING_FROM`` bytes
get the flag by default, so "default" here is the base flags with the size rule switched off.

    .venv/bin/python benchmarks/iree_data_tiling.py      # needs benchmarks/make_3b_shaped.py --whole
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["DRIFTSCOPE_CACHE"] = tempfile.mkdtemp(prefix="dt-cache-")
import driftscope.capture.iree as iree
from driftscope.capture.runtimes import get_runtime
from driftscope.families.checkpoints import open_checkpoint
from driftscope.model.blas import mlx_blas
from make_3b_shaped import ensure_whole
from whole_model import IMAGE, plain_whole, with_text

mlx_blas()
BASE = iree.BASE_FLAGS

ck = open_checkpoint(ensure_whole(1)[0])
iree.DATA_TILING_FROM = float("inf")  # the size rule off: the variants set the flag themselves
inputs = with_text(ck, [IMAGE])
rt = get_runtime("iree")(ck, "f32", options={})
rt.load()
out = Path(tempfile.mkdtemp(prefix="dt-out-"))
res = {"default": [], "data tiling": []}
for variant in ("default", "data tiling"):  # warm-up: compiles
    iree.BASE_FLAGS = BASE + (("--iree-opt-data-tiling",) if variant != "default" else ())
    t = time.perf_counter()
    plain_whole(rt, inputs, out)
    print(variant, "warm-up (compile)", round(time.perf_counter() - t, 1), flush=True)
for _ in range(2):
    for variant in ("default", "data tiling"):
        iree.BASE_FLAGS = BASE + (("--iree-opt-data-tiling",) if variant != "default" else ())
        s = plain_whole(rt, inputs, out)
        res[variant].append(s)
        print(variant, round(s, 2), flush=True)
d, t = statistics.median(res["default"]), statistics.median(res["data tiling"])
print(f"default {d:.2f}s {res['default']}, data tiling {t:.2f}s {res['data tiling']}: {t / d:.2f}x")
