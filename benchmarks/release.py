"""What releasing the runtimes' models costs an investigation: a full collection at every release, or only where
reference counting did not free the model (``core.memory``).

    .venv/bin/python benchmarks/release.py [--params FILE] [--repeats 3]

``--params`` defaults to the tiny Qwen2.5-VL fixture on the shapes image: transformers f32 against MLX f32 and
bf16 (bf16 replayed and narrowed), four text tokens, no notebooks. In one process (torch, transformers, MLX
imported by a first, unmeasured run), alternating: the investigation as it is, and with ``core.memory.free``
collecting at every release (the former ``gc.collect()`` in ``Runtime.release``). Prints each way's median wall
seconds, its full collections, and their ratio.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = {
    "name": "release",
    "checkpoint": str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"),
    "images": [str(ROOT / "fixtures" / "images" / "shapes_448.png")],
    "runtimes": ["transformers:f32", "mlx:f32", "mlx:bf16"],
    "replay": ["mlx:bf16"],
    "text": {"max_new_tokens": 4},
    "notebooks": [],
}


def measure(params: Path, out: Path, always: bool) -> tuple[float, int]:
    """(wall seconds, full collections) of one investigation into ``out``."""
    import driftscope.core.memory as memory
    from driftscope.run.investigation import investigate

    shutil.rmtree(out, ignore_errors=True)
    counted = [0]
    original, collect = memory.free, gc.collect

    def counting(*args):
        counted[0] += 1
        return collect(*args)

    gc.collect = counting
    if always:
        memory.free = lambda watched: original(None)
    try:
        start = time.perf_counter()
        investigate(params, out)
        return time.perf_counter() - start, counted[0]
    finally:
        gc.collect, memory.free = collect, original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="driftscope-release-"))
    if args.params is None:
        import yaml

        args.params = base / "release.yaml"
        args.params.write_text(yaml.safe_dump(DEFAULT))
    measure(args.params, base / "warm", False)  # imports and first loads, not measured
    runs: dict[str, list[tuple[float, int]]] = {"now": [], "former": []}
    for _ in range(args.repeats):
        runs["former"].append(measure(args.params, base / "former", True))
        runs["now"].append(measure(args.params, base / "now", False))
    shutil.rmtree(base, ignore_errors=True)
    median = {way: tuple(statistics.median(column) for column in zip(*rs, strict=True)) for way, rs in runs.items()}
    print(f"| {args.params.name} ({args.repeats} repeats, median) | wall s | full collections |")
    print("|---|---|---|")
    for way, label in (("former", "a full collection at every release"), ("now", "only where a model outlived it")):
        print(f"| {label} | {median[way][0]:.2f} | {median[way][1]:.0f} |")
    print(f"ratio (now / former wall): {median['now'][0] / median['former'][0]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
