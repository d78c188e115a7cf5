"""What keying on content costs (issue 49 item 4): a checkpoint's SHA-256 against reading its bytes, and the memo hit
(the stat key with the status-change time) a later run pays instead, side by side in one process.

    .venv/bin/python benchmarks/content_digest.py [--gib 2] [--checkpoint DIR] [--repeats 5]

A checkpoint of ``--gib`` GiB of random bytes in four shards (or ``--checkpoint``), with its files in the page cache
(each way reads them alike). Per repeat, alternating: every file read whole (what a loader reads anyway: the floor),
its SHA-256 as a first run computes it (``core.digests.tree_digest`` with nothing remembered), the same with the memo
a run keeps under the reference cache (a fresh process: only the memo file remembers), and ``run.reuse.reads`` of a
parameter file naming it (what a reuse check computes: the checkpoint, the image, driftscope's own source). Prints
each way's median seconds and the ratios side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARDS = 4


def synthetic(folder: Path, gib: float) -> Path:
    """``gib`` GiB of random bytes in :data:`SHARDS` files and a config, as a checkpoint directory."""
    folder.mkdir(parents=True, exist_ok=True)
    size = int(gib * 2**30 / SHARDS)
    chunk = os.urandom(1 << 24)
    for index in range(SHARDS):
        with open(folder / f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors", "wb") as handle:
            for start in range(0, size, len(chunk)):
                handle.write(chunk[: min(len(chunk), size - start)])
    (folder / "config.json").write_text('{"model_type": "qwen2_5_vl"}\n')
    return folder


def read_all(folder: Path) -> int:
    total, buffer = 0, bytearray(1 << 22)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb", buffering=0) as handle:
            while count := handle.readinto(buffer):
                total += count
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--checkpoint", help="a checkpoint directory to hash instead of the synthetic one")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from driftscope.core import digests
    from driftscope.run.params import parse_parameters
    from driftscope.run.reuse import reads

    work = Path(tempfile.mkdtemp(prefix="driftscope-digest-"))
    os.environ["DRIFTSCOPE_REFERENCE_CACHE"] = str(work / "cache")  # the memo's place, as a run's
    os.environ["DRIFTSCOPE_SEAL_KEY"] = str(work / "seal.key")
    (work / "cache").mkdir()
    try:
        folder = Path(args.checkpoint) if args.checkpoint else synthetic(work / "checkpoint", args.gib)
        size = read_all(folder)
        time.sleep(digests.RACY_NS / 1e9 + 0.1)  # files changed a moment ago are not remembered
        memo = work / "cache" / "checkpoint-digests.json"
        digests.tree_digest(folder, memo)  # the memo a first run leaves
        image = ROOT / "fixtures" / "images" / "checkerboard_140.png"
        params = parse_parameters(
            {"checkpoint": str(folder), "images": [str(image)], "runtimes": ["transformers:f32", "mlx:f32"]}
        )

        def fresh(function):
            def timed() -> float:
                digests._known.clear()  # a fresh process: nothing remembered in memory
                start = time.perf_counter()
                function()
                return time.perf_counter() - start

            return timed

        ways = {
            "read every byte": fresh(lambda: read_all(folder)),
            "SHA-256, nothing remembered": fresh(lambda: digests.tree_digest(folder, None)),
            "SHA-256 from the memo": fresh(lambda: digests.tree_digest(folder, memo)),
            "reuse check (run.reuse.reads)": fresh(lambda: reads(params)),
        }
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, way in ways.items():
                seconds[name].append(way())
        median = {name: statistics.median(values) for name, values in seconds.items()}
        print(f"checkpoint: {folder} ({size / 2**30:.2f} GiB in the page cache), {args.repeats} repeats, median s")
        base = median["read every byte"]
        hashed = median["SHA-256, nothing remembered"]
        print("| way | median s | GiB/s | / read | / SHA-256 |\n|---|---|---|---|---|")
        for name, value in median.items():
            rate = f"{size / 2**30 / value:.2f}" if value > 0 else "-"
            print(f"| {name} | {value:.4f} | {rate} | {value / base:.3f}x | {value / hashed:.5f}x |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
