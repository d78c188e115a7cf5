"""The three runtimes on the Qwen2.5-VL-3B-shaped vision tower: tap overhead, compile, compare, render,
memory, and how cost grows with patches. One process, one run, everything measured side by side.

    .venv/bin/python benchmarks/real_size.py [--quick] [--out DIR]

Generates the 3B-shaped checkpoint on first use (benchmarks/make_3b_shaped.py, outside the repo).
Prints Markdown tables and the target ratios; ``--out`` keeps the run's outputs (default: a temp dir).
``--quick`` skips the scaling sweep.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RUNTIMES = (("transformers", "f32"), ("mlx", "f32"), ("iree", "f32"))
#: label -> (runtime, policy, options); the IREE path in both graph modes
VARIANTS = {
    "transformers:f32": ("transformers", "f32", {}),
    "mlx:f32": ("mlx", "f32", {}),
    "iree:f32 whole": ("iree", "f32", {"graph": "whole"}),
    "iree:f32 blocks": ("iree", "f32", {"graph": "blocks"}),
}
PAGE = os.sysconf("SC_PAGE_SIZE")
GRAPH = os.environ.get("BENCH_IREE_GRAPH", "whole")  # the IREE mode the whole-investigation run uses


class PeakRSS:
    """Samples this process's resident memory every 20 ms; ``peak`` since the last ``reset``."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * PAGE

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def reset(self) -> None:
        self.peak = self.now()


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the scaling sweep")
    parser.add_argument("--out", help="keep outputs here")
    args = parser.parse_args(argv)

    from driftscope.blas import mlx_blas
    from driftscope.checkpoint import open_checkpoint
    from driftscope.compare import compare_tapsets
    from driftscope.contract import load_contract
    from driftscope.families import stage_plan
    from driftscope.inputs import prepare_inputs
    from driftscope.runtimes import get_runtime
    from driftscope.stages import StageSelection
    from make_3b_shaped import ensure_3b_shaped

    print(f"MLX BLAS: {mlx_blas()}")
    checkpoint = open_checkpoint(ensure_3b_shaped())
    out = Path(args.out or tempfile.mkdtemp(prefix="driftscope-bench-"))
    os.environ["DRIFTSCOPE_CACHE"] = str(out / "cache")  # cold IREE compiles
    rss = PeakRSS()
    image = ROOT / "fixtures" / "images" / "shapes_448.png"
    inputs = prepare_inputs(checkpoint, [image])
    full = stage_plan(checkpoint.family, checkpoint.config)
    plans = {"blocks": full.select(StageSelection(blocks=True)), "substages": full.select(StageSelection.everything())}
    weights_bytes = sum(p.stat().st_size for p in checkpoint.path.glob("*.safetensors"))
    rows: dict[str, dict] = {}
    taps: dict[str, dict] = {}

    def plain(runtime) -> float:
        if runtime.name == "iree":  # the production-like graph: the whole tower, final output only
            runtime.options.update(taps="final", graph="whole")
            runtime.capture(inputs, full.select(StageSelection(blocks=False)), out / "plain-iree")
            return runtime.timings["run_s"]
        start = time.perf_counter()
        runtime.run_vision(inputs)
        return time.perf_counter() - start

    def warm_compile() -> float:
        """A second compile of the production-like graph: the cache lookup and module load."""
        from driftscope.compiled.graph import lower_vision_tower
        from driftscope.compiled.iree import IreeModule, compile_graph
        from driftscope.emitters.qwen2_5_vl import VisionSpec, load_vision_weights
        from driftscope.geometry import pack_images
        from driftscope.precision import get_policy

        spec = VisionSpec.from_config(checkpoint.config)
        weights = load_vision_weights(checkpoint.path, spec)
        rows_ = pack_images(inputs.grid_thw).rows
        graph = lower_vision_tower(spec, get_policy("f32"), weights, rows_, ("vision.merger",))
        start = time.perf_counter()
        artifact = compile_graph(graph)
        IreeModule(artifact, graph.output_names)
        assert artifact.cache_hit
        return time.perf_counter() - start

    for label, (name, policy, options) in VARIANTS.items():
        runtime = get_runtime(name)(checkpoint, policy, options=dict(options))
        rss.reset()
        runtime.load()
        plain(runtime)  # warm-up (and the cold IREE compile of the production-like graph)
        cold = runtime.timings.get("compile_s")
        plain_s = min(plain(runtime) for _ in range(2))
        row = {"plain_s": plain_s, "compile_cold_s": cold if name == "iree" else None, "compile_warm_s": None}
        if name == "iree":
            row["compile_warm_s"] = warm_compile()
            runtime.options.clear()
            runtime.options.update(options)
        for kind, plan in plans.items():
            samples = []
            for rep in range(2 if kind == "blocks" else 1):
                tapset = runtime.capture(inputs, plan, out / f"{label.replace(' ', '-')}-{kind}-{rep}")
                samples.append(runtime.timings["run_s"] if name == "iree" else runtime.timings["capture_s"])
            row[f"{kind}_s"] = min(samples)
            taps.setdefault(kind, {})[label] = tapset
        row["peak_rss"] = rss.peak
        runtime.release()
        del runtime
        gc.collect()
        rows[label] = row
        print(f"  {label}: {row}", flush=True)

    contract = load_contract(None)
    start = time.perf_counter()
    reference = taps["substages"]["transformers:f32"]
    for label, tapset in taps["substages"].items():
        if label != "transformers:f32":
            compare_tapsets(reference, tapset, contract, plans["substages"])
    compare_s = time.perf_counter() - start
    largest = max(reference.shape(s)[0] * math.prod(reference.shape(s)[1:]) * 4 for s in reference.stage_ids())

    # the whole investigation, warm: three runtimes, all blocks, substages of two layers, compare, report, HTML
    import yaml

    params = out / "bench.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "bench-3b",
                "checkpoint": str(checkpoint.path),
                "images": [str(image)],
                "runtimes": [f"{n}:{p}" for n, p in RUNTIMES],
                "stages": {"blocks": True, "substages": [0, 7]},
                "replay": False,
                "notebooks": ["01_stage_parity"],
            }
        )
    )
    from driftscope.cli import main as cli

    for attempt in ("cold", "warm"):  # noqa: B007  # the first compiles the tapped IREE graph; the second reuses it
        start = time.perf_counter()
        cli(["run", str(params), "--out", str(out / f"investigation-{attempt}"), "--force", "--no-gate"])
        investigation_s = time.perf_counter() - start
    from driftscope.report import Report

    report = Report.load(out / "investigation-warm" / "report.json")
    render_s = investigation_s - sum(
        r["timings"].get("capture_s", 0) + r["timings"].get("load_s", 0) for r in report.data["runtimes"]
    )

    print(
        f"\n3B-shaped vision tower (depth 32, hidden 1280), image {image.name} -> grid {inputs.grid_thw.tolist()}, "
        f"{inputs.pixel_values.shape[0]} patches; weights {gib(weights_bytes)} GiB f32; MLX BLAS: {mlx_blas()}\n"
    )
    print(
        "| runtime | plain forward s | all block outputs tapped s | every substage tapped s | "
        "tap overhead (blocks) | tap overhead (substages) | IREE compile cold s | warm s | peak RSS GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        cold = f"{r['compile_cold_s']:.1f}" if r["compile_cold_s"] else ""
        warm = f"{r['compile_warm_s']:.3f}" if r["compile_warm_s"] is not None else ""
        print(
            f"| {label} | {r['plain_s']:.2f} | {r['blocks_s']:.2f} | {r['substages_s']:.2f} | "
            f"{r['blocks_s'] / r['plain_s']:.3f}x | {r['substages_s'] / r['plain_s']:.3f}x | {cold} | {warm} | "
            f"{gib(r['peak_rss'])} |"
        )
    forwards = sum(rows[label]["plain_s"] for label in ("transformers:f32", "mlx:f32", "iree:f32 whole"))
    iree = rows["iree:f32 whole"]
    print(
        f"\ncomparison of every substage, two pairs: {compare_s:.1f}s; largest stage tensor {largest / 2**20:.1f} MiB"
    )
    print(
        f"whole investigation (warm, 3 runtimes, blocks + substages of 2 layers, compare, report, HTML): "
        f"{investigation_s:.1f}s = {investigation_s / forwards:.2f}x the sum of the three plain forwards "
        f"({forwards:.1f}s); loading, notebook and rendering outside the captures: {render_s:.1f}s"
    )
    print(
        f"IREE warm / cold compile: {iree['compile_warm_s'] / iree['compile_cold_s']:.4f} "
        f"({iree['compile_cold_s'] / max(iree['compile_warm_s'], 1e-9):.0f}x faster)"
    )
    print(
        "peak RSS per runtime over weights + largest stage: "
        + ", ".join(f"{label} {gib(r['peak_rss'])} GiB" for label, r in rows.items())
        + f" (weights {gib(weights_bytes)} GiB)"
    )

    if args.quick:
        return
    print("\n## How cost grows (plain forward and all-block-taps capture; one image per size, then 448x448 buckets)\n")
    cases = [(f"{s}x{s}", [s]) for s in (224, 448, 672, 896)] + [("2 x 448", [448, 448]), ("4 x 448", [448] * 4)]
    from PIL import Image

    sweep: dict[str, list] = {}
    for case, sizes in cases:
        paths = []
        for i, side in enumerate(sizes):
            path = out / f"img-{side}-{i}.png"
            with Image.open(image) as picture:
                picture.resize((side, side)).rotate(90 * i).save(path)
            paths.append(path)
        case_inputs = prepare_inputs(checkpoint, paths)
        patches = int(case_inputs.pixel_values.shape[0])
        for name, policy in RUNTIMES:
            runtime = get_runtime(name)(checkpoint, policy)
            rss.reset()
            runtime.load()
            runtime.capture(case_inputs, plans["blocks"], out / f"sweep-{name}-{case.replace(' ', '')}")
            tapped = runtime.timings["run_s"] if name == "iree" else runtime.timings["capture_s"]
            if name == "iree":
                forward = runtime.timings["run_s"]  # the tapped graph's run; the plain run follows
                runtime.options["taps"] = "final"
                runtime.capture(case_inputs, full.select(StageSelection(blocks=False)), out / "p")
                forward = runtime.timings["run_s"]
            else:
                start = time.perf_counter()
                runtime.run_vision(case_inputs)
                forward = time.perf_counter() - start
            sweep.setdefault(f"{name}:{policy}", []).append((case, patches, forward, tapped, rss.peak))
            runtime.release()
            del runtime
            gc.collect()
            print(
                f"  {case} {name}: {patches} patches, forward {forward:.2f}s, tapped {tapped:.2f}s, "
                f"peak {gib(rss.peak)} GiB",
                flush=True,
            )
    print("\n| runtime | case | patches | plain forward s | all blocks tapped s | tapped / plain | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|")
    for label, points in sweep.items():
        for case, patches, forward, tapped, peak in points:
            print(
                f"| {label} | {case} | {patches} | {forward:.2f} | {tapped:.2f} | {tapped / forward:.2f}x | "
                f"{gib(peak)} |"
            )
    print("\nobserved exponents against patch count (single images 224..896; log-log least squares):")
    for label, points in sweep.items():
        single = [p for p in points if "x" in p[0] and " " not in p[0]]
        xs = [math.log(p[1]) for p in single]

        def slope(values, xs=xs):
            ys = [math.log(v) for v in values]
            mx, my = statistics.mean(xs), statistics.mean(ys)
            return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)

        print(
            f"  {label}: forward time ~ patches^{slope([p[2] for p in single]):.2f}, tapped time ~ "
            f"patches^{slope([p[3] for p in single]):.2f}, peak RSS ~ patches^{slope([p[4] for p in single]):.2f}"
        )


if __name__ == "__main__":
    main()
