"""The compiled runtime's text weights prefetched while its tower runs, against read cold: an IREE f32 capture of
the whole 3B-shaped model (every block, the text layers, 8 tokens) in a fresh process each, the checkpoint pushed
out of the page cache before each (``posix_fadvise(DONTNEED)``: what a previous runtime's resident copy does to
it in an investigation on a 24 GiB machine), with the prefetch off and on, alternating.

    .venv/bin/python benchmarks/text_prefetch.py [--scale 4] [--repeats 2]

A first child compiles every graph into the benchmark's own IREE cache; the timed children find them there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
IMAGE = ROOT / "fixtures" / "images" / "shapes_224.png"
TOKENS = 8


def evict(checkpoint: Path) -> None:
    """Drop the checkpoint's clean pages from the page cache."""
    for file in checkpoint.glob("*.safetensors"):
        handle = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(handle)


def child(checkpoint: Path, prefetch: bool, cache: Path, out: Path) -> None:
    """One load and capture; its seconds as JSON on stdout."""
    import time

    from driftscope.capture.runtimes import get_runtime
    from driftscope.capture.runtimes.compiled import CompiledRuntime
    from driftscope.families.checkpoints import open_checkpoint
    from whole_model import whole_plan, with_text

    if not prefetch:
        CompiledRuntime._prefetch_text = lambda self, inputs: None
    opened = open_checkpoint(checkpoint)
    inputs = with_text(opened, [IMAGE], tokens=TOKENS)
    runtime = get_runtime("iree")(opened, "f32", options={"cache_dir": str(cache)})
    start = time.perf_counter()
    runtime.load()
    load_s = time.perf_counter() - start
    runtime.capture(inputs, whole_plan(opened, TOKENS), out)
    print(json.dumps({"load_s": load_s, "capture_s": runtime.timings["capture_s"]}))


def run_child(checkpoint: Path, prefetch: bool, cache: Path, out: Path) -> dict:
    command = [sys.executable, __file__, "--child", str(checkpoint), "--cache", str(cache), "--out", str(out)]
    done = subprocess.run(command + (["--prefetch"] if prefetch else []), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (1: the real 3B shape)")
    parser.add_argument("--repeats", type=int, default=2, help="off/on pairs (medians)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child), args.prefetch, Path(args.cache), Path(args.out))
    from make_3b_shaped import ensure_whole

    checkpoint, _ = ensure_whole(args.scale)
    with tempfile.TemporaryDirectory(prefix="driftscope-prefetch-") as scratch:
        cache, taps = Path(scratch) / "iree", Path(scratch) / "taps"
        run_child(checkpoint, True, cache, taps)  # compiles every graph once
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.repeats):
            for prefetch in (False, True):
                evict(checkpoint)
                seconds[prefetch].append(run_child(checkpoint, prefetch, cache, taps)["capture_s"])
    off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"checkpoint {checkpoint}, page cache emptied before each capture, {args.repeats} pairs")
    print("| text weights | IREE f32 capture s (median) | samples |")
    print("|---|---|---|")
    for label, key in (("read cold", False), ("prefetched while the tower runs", True)):
        print(f"| {label} | {statistics.median(seconds[key]):.1f} | {', '.join(f'{s:.1f}' for s in seconds[key])} |")
    print(f"prefetched / cold: {on / off:.2f}x")


if __name__ == "__main__":
    main()
