"""Compile time, run time and tap overhead of the compiled path, measured side by side in one run.

    .venv/bin/python benchmarks/compiled_path.py [--checkpoint DIR] [--image PNG] [--repeats N]

For the ``jax`` and ``iree`` runtimes under ``f32``: the tower lowered once with every stage as an
output ("all taps") and once with only ``vision.merger`` ("final only", the production-like
graph). Compiles go to a fresh cache directory so each is a real compile; run times are the
median of N calls of the already-loaded module. Prints a Markdown table and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tower_setup(checkpoint_dir: str, image: str):
    """A Qwen2.5-VL tower's pieces for the emitter, on one image: (checkpoint, emitter spec, weights, processor
    output, window packing)."""
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.families.qwen2_5_vl.geometry import pack_images
    from driftscope.families.qwen2_5_vl.jax.model import VisionSpec, load_vision_weights

    checkpoint = open_checkpoint(checkpoint_dir)
    spec = VisionSpec.from_config(checkpoint.config)
    weights = load_vision_weights(checkpoint.path, spec)
    inputs = prepare_inputs(checkpoint, [image])
    bucket = pack_images(inputs["grid_thw"], None, spec.spatial_merge_size, spec.window_size, spec.patch_size)
    return checkpoint, spec, weights, inputs, bucket


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"))
    parser.add_argument("--image", default=str(ROOT / "fixtures" / "images" / "shapes_448.png"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policy", default="f32")
    args = parser.parse_args(argv)

    from driftscope.capture.iree import IreeModule, compile_graph
    from driftscope.families import stage_plan
    from driftscope.families.qwen2_5_vl.jax.program import HOST_STAGES, lower_vision_tower
    from driftscope.model.policies import get_policy
    from driftscope.taps.stages import StageSelection

    checkpoint, spec, weights, inputs, bucket = tower_setup(args.checkpoint, args.image)
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection.everything())
    every = tuple(stage.id for stage in plan if stage.id not in HOST_STAGES)
    policy = get_policy(args.policy)
    feeds = {"pixel_values": inputs["pixel_values"].astype("float32"), **bucket.graph_inputs()}

    def timed(call, repeats):
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    results = {}
    with tempfile.TemporaryDirectory() as cache:
        for label, taps in (("all taps", every), ("final only", ())):
            start = time.perf_counter()
            graph = lower_vision_tower(spec, policy, weights, bucket.rows, taps)
            lower_s = time.perf_counter() - start
            arguments = graph.arguments(weights, feeds)
            start = time.perf_counter()
            compiled = graph.lowered.compile()
            jax_compile_s = time.perf_counter() - start
            flat = arguments[len(weights) :]

            def run_jax(compiled=compiled, flat=flat):
                import jax

                jax.block_until_ready(compiled(weights, *flat))

            run_jax()
            jax_run_s = timed(run_jax, args.repeats)
            artifact = compile_graph(graph, cache_dir=Path(cache))
            module = IreeModule(artifact, graph.output_names)
            module(arguments)
            iree_run_s = timed(lambda module=module, arguments=arguments: module(arguments), args.repeats)
            results[label] = {
                "outputs": len(graph.output_names),
                "lower_s": lower_s,
                "jax_compile_s": jax_compile_s,
                "jax_run_s": jax_run_s,
                "iree_compile_s": artifact.compile_s,
                "iree_run_s": iree_run_s,
                "vmfb_bytes": artifact.path.stat().st_size,
            }

    print(
        f"checkpoint {checkpoint.path.name}, image {Path(args.image).name}, grid {inputs['grid_thw'].tolist()}, "
        f"bucket {bucket.rows} rows, policy {policy.name}, median of {args.repeats} runs\n"
    )
    print("| graph | outputs | lower s | jax compile s | jax run s | iree-compile s | iree run s | vmfb bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        print(
            f"| {label} | {r['outputs']} | {r['lower_s']:.2f} | {r['jax_compile_s']:.2f} | {r['jax_run_s']:.4f} | "
            f"{r['iree_compile_s']:.2f} | {r['iree_run_s']:.4f} | {r['vmfb_bytes']} |"
        )
    a, f = results["all taps"], results["final only"]
    print(
        f"\ntap overhead (all taps / final only): iree run {a['iree_run_s'] / f['iree_run_s']:.2f}x, "
        f"jax run {a['jax_run_s'] / f['jax_run_s']:.2f}x, iree-compile {a['iree_compile_s'] / f['iree_compile_s']:.2f}x"
    )
    print(f"iree run / jax run (final only): {f['iree_run_s'] / f['jax_run_s']:.2f}x")


if __name__ == "__main__":
    main()
