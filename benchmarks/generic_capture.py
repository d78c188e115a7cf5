"""The generic family's capture against a deep family's hand-written one, on the same checkpoint, side by side.

    .venv/bin/python benchmarks/generic_capture.py [--checkpoint DIR] [--runtimes transformers,mlx] [--repeats 5]
        [--substages]

Default checkpoint: the tiny Qwen2.5-VL fixture; ``--checkpoint`` takes any checkpoint a deep family reads (e.g. the
3B-shaped tower from ``benchmarks/make_3b_shaped.py``). Per runtime, the model is loaded once; each repeat captures
the deep family's plan and then the generic family's plan (block outputs; ``--substages``: every block's pieces
too) on the same inputs (the 448x448 shapes image), alternating, so drift in the machine's speed hits both alike.
Prints the median seconds of each and the median of the paired ratios (generic / hand-written), with their range.
The generic family's one-off reading of the checkpoint (both models probed) is timed apart: it is cached per
checkpoint and not part of a capture.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"))
    parser.add_argument("--runtimes", default="transformers,mlx")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--substages", action="store_true")
    args = parser.parse_args(argv)

    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import get_family
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.model.blas import mlx_blas
    from driftscope.taps.stages import StageSelection

    mlx_blas()
    image = ROOT / "fixtures" / "images" / "shapes_448.png"
    selection = StageSelection(blocks=True, substages="all" if args.substages else ())
    deep = open_checkpoint(args.checkpoint)
    generic = open_checkpoint(args.checkpoint, "generic")
    start = time.perf_counter()
    plans = {
        "hand-written": get_family(deep.family).plan_for(deep).select(selection),
        "generic": get_family("generic").plan_for(generic).select(selection),
    }
    print(f"checkpoint {args.checkpoint} ({deep.family}); the generic reading took {time.perf_counter() - start:.1f}s")
    checkpoints = {"hand-written": deep, "generic": generic}
    inputs = {name: get_family(c.family).prepare_inputs(c, [image]) for name, c in checkpoints.items()}
    out = Path(tempfile.mkdtemp(prefix="driftscope-generic-capture-"))
    print(f"stages: hand-written {len(plans['hand-written'])}, generic {len(plans['generic'])}")
    print("| runtime | hand-written s (median) | generic s (median) | generic / hand-written (median, range) |")
    print("|---|---|---|---|")
    for name in args.runtimes.split(","):
        runtimes = {kind: get_runtime(name)(checkpoints[kind], "f32") for kind in plans}
        for runtime in runtimes.values():
            runtime.load()
        seconds: dict[str, list[float]] = {kind: [] for kind in plans}
        for repeat in range(args.repeats + 1):  # the first round warms both up and is not counted
            for kind, runtime in runtimes.items():
                begin = time.perf_counter()
                runtime.capture(inputs[kind], plans[kind], out / f"{name}-{kind}-{repeat}")
                if repeat:
                    seconds[kind].append(time.perf_counter() - begin)
        ratios = [g / h for g, h in zip(seconds["generic"], seconds["hand-written"], strict=True)]
        hand, gen = (statistics.median(seconds[kind]) for kind in ("hand-written", "generic"))
        print(
            f"| {name}:f32 | {hand:.3f} | {gen:.3f} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
        for runtime in runtimes.values():
            runtime.release()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
