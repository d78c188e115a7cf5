"""Every substage of every block on the Qwen2.5-VL-3B-shaped vision tower, by how the taps reach the file:
inline (the capture's thread writes each stage as it arrives), background (a writer thread; a stage that still
aliases the engine's memory is copied once first) and, for the measurement only, background without that copy
(unsafe where an engine overwrites a tensor in place). Side by side in one process: per repeat a plain tower
forward, then each way's capture, alternating, so drift in the machine's speed hits them alike.

    .venv/bin/python benchmarks/tap_writes.py [--runtimes transformers:f32,mlx:f32,iree:f32] [--repeats 3]

Prints per runtime and way the median seconds, the median of the paired ratios to the plain forward (and their
range), and the seconds the capture's thread spent handing stages over. Each capture's ~3.3 GB of taps is
deleted before the next, so none pays for another's dirty pages.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
WAYS = ("inline", "background", "background-no-copy")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default="transformers:f32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ways", default=",".join(WAYS))
    args = parser.parse_args(argv)

    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.model.blas import mlx_blas
    from driftscope.taps import tapset
    from driftscope.taps.stages import StageSelection
    from make_3b_shaped import ensure_3b_shaped
    from real_size import plain_forward

    print(f"MLX BLAS: {mlx_blas()}")
    checkpoint = open_checkpoint(ensure_3b_shaped())
    out = Path(tempfile.mkdtemp(prefix="driftscope-tapwrites-"))
    inputs = prepare_inputs(checkpoint, [ROOT / "fixtures" / "images" / "shapes_448.png"])
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection.everything())
    owned, handed = tapset.owned, {"s": 0.0}
    write = tapset.TapWriter._write

    def timed_write(self, array, source):  # the capture thread's share of the writing, per way
        start = time.perf_counter()
        write(self, array, source)
        handed["s"] += time.perf_counter() - start

    tapset.TapWriter._write = timed_write
    ways = args.ways.split(",")
    for spec in args.runtimes.split(","):
        name, policy = spec.split(":")
        runtime = get_runtime(name)(checkpoint, policy)
        runtime.load()
        plain_forward(runtime, inputs, out)  # warm-up (IREE: the cold compile of the plain graph)
        runtime.capture(inputs, plan, out / "warm")  # warm-up (IREE: compiles the tapped graph once)
        _clear(out)
        rows = {way: [] for way in ways}
        plains = []
        for rep in range(args.repeats):
            plains.append(plain_forward(runtime, inputs, out))
            for way in ways:
                runtime.options["tap_writes"] = "inline" if way == "inline" else "background"
                tapset.owned = (lambda array, source: array) if way.endswith("no-copy") else owned
                handed["s"] = 0.0
                tapset_ = runtime.capture(inputs, plan, out / f"{rep}")
                seconds = runtime.timings["capture_s"]  # every runtime's whole capture, its writes included
                size = sum(tapset_.mapped(s).nbytes for s in tapset_.stage_ids())
                rows[way].append((seconds, seconds / plains[-1], handed["s"]))
                print(
                    f"  {spec} rep {rep} {way}: {seconds:.2f}s = {seconds / plains[-1]:.3f}x plain "
                    f"{plains[-1]:.2f}s; handed over in {handed['s']:.2f}s; {size / 2**30:.2f} GiB",
                    flush=True,
                )
                del tapset_
                _clear(out)
        tapset.owned = owned
        print(f"{spec}: plain tower forward median {statistics.median(plains):.2f}s over {args.repeats}")
        for way, samples in rows.items():
            ratios = [r for _, r, _ in samples]
            print(
                f"| {spec} | {way} | {statistics.median(s for s, _, _ in samples):.2f} | "
                f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) | "
                f"{statistics.median(h for _, _, h in samples):.2f} |"
            )
        runtime.release()
        del runtime
        gc.collect()


def _clear(out: Path) -> None:
    for path in out.glob("*"):
        if path.is_file():
            path.unlink()


if __name__ == "__main__":
    main()
