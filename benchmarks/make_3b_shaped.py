"""Write the random-weight Qwen2.5-VL-3B-shaped checkpoints on demand.

    .venv/bin/python benchmarks/make_3b_shaped.py [--out DIR]                 # the vision tower at full size
    .venv/bin/python benchmarks/make_3b_shaped.py --whole [--scale K] [--out DIR] [--shard-gib G]
    .venv/bin/python benchmarks/make_3b_shaped.py --7b [--scale K] [--dtype float32] [--out DIR]

The first is the tower benchmark's checkpoint (about 2.8 GB of float32). ``--whole`` writes the whole model
with Qwen2.5-VL-3B's real dimensions (vision depth 32 / hidden 1280, 36 text layers, hidden 2048, 16 heads
/ 2 KV heads, MLP 11008, vocabulary 151936, tied embeddings; ~15 GB float32) in safetensors shards with an
index file as a real checkpoint ships, plus a bfloat16 copy next to it (``...-bf16``, ~7.5 GB), one shard in
memory at a time. ``--scale K`` divides every width by K (depths, heads and vocabulary kept): ``--scale 4``
is the ~1.2 GB variant docs/benchmarks.md measures on a shared machine.

``--7b`` writes Qwen2.5-VL-7B's shape (the 3B's tower; 28 text layers at hidden 3584, 28 heads / 4 KV heads, MLP
18944, vocabulary 152064, an untied head) in one dtype, bfloat16 by default as the released checkpoint ships
(~16.6 GB; ~33 GB in float32).

Default location: ``$DRIFTSCOPE_CACHE/checkpoints/`` or ``~/.cache/driftscope/checkpoints/`` (outside the
repository). Skips the work when the checkpoint is already there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from driftscope.families.qwen2_5_vl.fixture import (
    QWEN25_VL_3B_SHAPED,
    QWEN25_VL_3B_WHOLE,
    QWEN25_VL_7B_WHOLE,
    make_checkpoint,
    scaled_spec,
    write_whole_checkpoint,
)
from driftscope.model.synthetic import benchmark_cache_dir


def ensure_3b_shaped(out: Path | None = None) -> Path:
    out = Path(out) if out else benchmark_cache_dir() / "qwen2_5-vl-3b-shaped"
    if not (out / "model.safetensors").exists() and not (out / "model.safetensors.index.json").exists():
        start = time.perf_counter()
        make_checkpoint(out, QWEN25_VL_3B_SHAPED)
        print(f"wrote {out} in {time.perf_counter() - start:.0f}s")
    return out


def whole_name(scale: int) -> str:
    return "qwen2_5-vl-3b-whole" + (f"-w{scale}" if scale != 1 else "")


def ensure_whole(scale: int = 1, out: Path | None = None, shard_gib: float = 2.0) -> tuple[Path, Path]:
    """(float32 dir, bfloat16 dir) of the whole 3B-shaped model with widths divided by ``scale``."""
    out = Path(out) if out else benchmark_cache_dir() / whole_name(scale)
    bf16 = out.with_name(out.name + "-bf16")
    if not (out / "model.safetensors.index.json").exists() or not (bf16 / "model.safetensors.index.json").exists():
        start = time.perf_counter()
        write_whole_checkpoint(out, scaled_spec(QWEN25_VL_3B_WHOLE, scale), int(shard_gib * 2**30), bf16)
        print(f"wrote {out} and {bf16} in {time.perf_counter() - start:.0f}s")
    return out, bf16


def ensure_7b(scale: int = 1, dtype: str = "bfloat16", out: Path | None = None, shard_gib: float = 2.0) -> Path:
    """The Qwen2.5-VL-7B-shaped model with widths divided by ``scale``, in ``dtype`` (one directory)."""
    name = "qwen2_5-vl-7b-whole" + (f"-w{scale}" if scale != 1 else "") + ("" if dtype == "bfloat16" else f"-{dtype}")
    out = Path(out) if out else benchmark_cache_dir() / name
    if not (out / "model.safetensors.index.json").exists():
        start = time.perf_counter()
        write_whole_checkpoint(out, scaled_spec(QWEN25_VL_7B_WHOLE, scale), int(shard_gib * 2**30), dtype=dtype)
        print(f"wrote {out} in {time.perf_counter() - start:.0f}s")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="checkpoint directory")
    parser.add_argument("--whole", action="store_true", help="the whole model (vision and language)")
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (with --whole)")
    parser.add_argument("--shard-gib", type=float, default=2.0, help="float32 shard size (with --whole)")
    parser.add_argument("--7b", dest="seven", action="store_true", help="Qwen2.5-VL-7B's shape (one dtype)")
    parser.add_argument("--dtype", default="bfloat16", help="the 7B shape's dtype (bfloat16 or float32)")
    args = parser.parse_args()
    if args.seven:
        print(ensure_7b(args.scale, args.dtype, args.out, args.shard_gib))
    elif args.whole:
        print(*ensure_whole(args.scale, args.out, args.shard_gib))
    else:
        print(ensure_3b_shaped(args.out))
