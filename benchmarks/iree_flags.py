"""IREE's CPU compile flags on a vision-tower forward: host-tuned against generic, and a few more, side by side.

    .venv/bin/python benchmarks/iree_flags.py [--checkpoint DIR] [--image PNG] [--rounds N]

The tower is lowered once as the production-like graph (only ``vision.merger`` as output), compiled under each
flag set into a fresh cache, and the modules run round-robin (one call of each per round, so every set sees the
same machine load), N rounds; the table gives the median per set and its ratio to the default (driftscope's
``llvm-cpu`` target: ``--iree-llvmcpu-target-cpu=host``). ``generic`` replaces that with the baseline x86-64 /
aarch64 CPU. transformers' plain tower forward on the same inputs runs in the same rounds, as the yardstick.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
#: name -> iree-compile flags added after the target's own (a later --iree-llvmcpu-target-cpu wins)
FLAG_SETS = {
    "default (target-cpu=host)": (),
    "generic CPU": ("--iree-llvmcpu-target-cpu=generic",),
    "host + data tiling": ("--iree-opt-data-tiling",),
    "host + ukernels all": ("--iree-llvmcpu-enable-ukernels=all",),
    "host + data tiling + ukernels": ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"))
    parser.add_argument("--image", default=str(ROOT / "fixtures" / "images" / "shapes_448.png"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sets", nargs="*", help="flag sets to measure (default: all)")
    args = parser.parse_args(argv)

    import numpy as np
    from compiled_path import tower_setup
    from driftscope.capture.iree import IreeModule, compile_graph, host_cpu
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.qwen2_5_vl.jax.program import lower_vision_tower
    from driftscope.model.policies import get_policy

    checkpoint, spec, weights, inputs, bucket = tower_setup(args.checkpoint, args.image)
    feeds = {"pixel_values": inputs["pixel_values"].astype("float32"), **bucket.graph_inputs()}
    graph = lower_vision_tower(spec, get_policy("f32"), weights, bucket.rows, ())
    arguments = graph.arguments(weights, feeds)
    sets = {name: flags for name, flags in FLAG_SETS.items() if not args.sets or name in args.sets}
    calls, compiled, outputs = {}, {}, {}
    with tempfile.TemporaryDirectory() as cache:
        for name, flags in sets.items():
            artifact = compile_graph(graph, cache_dir=Path(cache) / str(len(compiled)), extra_flags=flags)
            module = IreeModule(artifact, graph.output_names)
            outputs[name] = np.asarray(module(arguments)["vision.merger"])  # warm-up call
            compiled[name] = (artifact.compile_s, artifact.path.stat().st_size)
            calls[name] = lambda module=module: module(arguments)
        oracle = get_runtime("transformers")(checkpoint, "f32")
        oracle.run_vision(inputs)
        calls["transformers:f32 forward"] = lambda: oracle.run_vision(inputs)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    base = medians[next(iter(sets))]
    reference = outputs[next(iter(sets))]
    print(
        f"checkpoint {checkpoint.path.name}, image {Path(args.image).name}, grid {inputs['grid_thw'].tolist()}, "
        f"bucket {bucket.rows} rows, f32, median of {args.rounds} round-robin rounds; host CPU {host_cpu()}\n"
    )
    print(
        "| flags | iree-compile s | vmfb bytes | run s (median) | spread (min-max) s | / default | max abs vs default |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, median in medians.items():
        compile_s, size = compiled.get(name, (None, None))
        spread = f"{min(samples[name]):.4f}-{max(samples[name]):.4f}"
        diff = f"{float(np.max(np.abs(outputs[name] - reference))):.2g}" if name in outputs else ""
        compiled_text = f"{compile_s:.2f} | {size}" if compile_s is not None else " | "
        print(f"| {name} | {compiled_text} | {median:.4f} | {spread} | {median / base:.2f}x | {diff} |")


if __name__ == "__main__":
    main()
