"""Write the random-weight Qwen2.5-VL-3B-shaped checkpoint (vision tower at full size) on demand.

    .venv/bin/python benchmarks/make_3b_shaped.py [--out DIR]

Default location: ``$DRIFTSCOPE_CACHE/checkpoints/qwen2_5-vl-3b-shaped`` or
``~/.cache/driftscope/checkpoints/...`` (outside the repository; about 2.8 GB of float32).
Skips the work when the checkpoint is already there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from driftscope.families.qwen2_5_vl.synthetic import QWEN25_VL_3B_SHAPED, make_checkpoint
from driftscope.synthetic import benchmark_cache_dir


def ensure_3b_shaped(out: Path | None = None) -> Path:
    out = Path(out) if out else benchmark_cache_dir() / "qwen2_5-vl-3b-shaped"
    if not (out / "model.safetensors").exists() and not (out / "model.safetensors.index.json").exists():
        start = time.perf_counter()
        make_checkpoint(out, QWEN25_VL_3B_SHAPED)
        print(f"wrote {out} in {time.perf_counter() - start:.0f}s")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="checkpoint directory")
    print(ensure_3b_shaped(parser.parse_args().out))
