"""A candidate with a patch from outside driftscope, captured in a process of its own (``run.isolated``) against in
the run's process, side by side: what the isolation of issue 49 item 12 costs a run.

    .venv/bin/python benchmarks/isolated_capture.py [--repeats 3]

The tiny Qwen2.5-VL fixture, transformers f32 against MLX f32 running ``tests/planted_patches.py:wrong_eps``, no
replay; one warm-up run, then each way per repeat, alternating. Prints each way's seconds and the ratio of medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="driftscope-isolated-"))
    os.environ.update(DRIFTSCOPE_REFERENCE_CACHE="off", DRIFTSCOPE_SEAL_KEY=str(work / "seal.key"))
    os.environ.pop("DRIFTSCOPE_TRUSTED_PATCHES", None)
    sys.path.insert(0, str(ROOT / "tests"))
    import driftscope.run.capture_step as step
    from conftest import write_params
    from driftscope.run.investigation import investigate
    from driftscope.run.params import load_parameters

    patch = {"callable": f"{ROOT / 'tests' / 'planted_patches.py'}:wrong_eps"}
    runtimes = ["transformers:f32", {"runtime": "mlx", "policy": "f32", "label": "patched", "patch": patch}]
    params = load_parameters(write_params(work / "p.yaml", "isolated", runtimes, notebooks=[], replay=False))
    investigate(params, work / "warm")
    isolated = step.isolated
    ways = {"isolated": isolated, "in the run's process": lambda spec: False}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for repeat in range(args.repeats):
        for name, rule in ways.items():
            step.isolated = rule
            start = time.perf_counter()
            investigate(params, work / f"{name}-{repeat}")
            seconds[name].append(time.perf_counter() - start)
    step.isolated = isolated
    for name, values in seconds.items():
        print(f"{name}: {', '.join(f'{v:.2f}' for v in values)} s, median {statistics.median(values):.2f} s")
    ratio = statistics.median(seconds["isolated"]) / statistics.median(seconds["in the run's process"])
    print(f"isolated / in the run's process: {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
