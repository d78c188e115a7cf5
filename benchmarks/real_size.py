"""The three runtimes on the Qwen2.5-VL-3B-shaped vision tower: tap overhead, compile, compare, render,
memory, and how cost grows with patches. The targets' figures come from one process and one run, measured
side by side (plain and tapped forwards alternate); the growth sweep runs each case in a fresh process.

    .venv/bin/python benchmarks/real_size.py [--quick | --investigation | --narrowing [CHECKPOINT]] [--out DIR]

Generates the 3B-shaped checkpoint on first use (benchmarks/make_3b_shaped.py, outside the repo).
Prints Markdown tables and the target ratios; ``--out`` keeps the run's outputs (default: a temp dir).
``--quick`` skips the scaling sweep (each of its cases runs in a fresh process, so memory is per case).
``--investigation`` measures only the whole-investigation target: the three plain forwards, then the run.
``--narrowing`` measures only the narrowing budget: the same block-level run (transformers f32 against MLX f32
with a defect planted in one block's norm2) with and without narrowing, each in a fresh process, side by side;
on the 3B-shaped tower, or on CHECKPOINT when given (e.g. fixtures/checkpoints/tiny-qwen2_5-vl-deep).
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
    "iree:f32": ("iree", "f32", {}),  # graph: auto, the default
    "iree:f32 whole": ("iree", "f32", {"graph": "whole"}),
    "iree:f32 blocks": ("iree", "f32", {"graph": "blocks"}),
}
PAGE = os.sysconf("SC_PAGE_SIZE")
REPEATS = 3  # plain/tapped pairs per runtime; the table shows medians
NOISE_FLOOR_MIB = 256  # working memory below this is not fitted


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
    parser.add_argument(
        "--investigation", action="store_true", help="only the three plain forwards and the whole investigation"
    )
    parser.add_argument(
        "--narrowing",
        nargs="?",
        const="3b",
        metavar="CHECKPOINT",
        help="only the narrowing budget (on the 3B-shaped tower, or on CHECKPOINT)",
    )
    parser.add_argument("--out", help="keep outputs here")
    parser.add_argument("--one", nargs=2, metavar=("RUNTIME", "KIND"), help=argparse.SUPPRESS)  # a sweep child
    parser.add_argument("--images", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        import json

        from driftscope.model.blas import mlx_blas

        mlx_blas()
        print(json.dumps(measure_one(*args.one, args.images, Path(args.out), Path(args.checkpoint))))
        return

    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.judge.compare import compare_tapsets
    from driftscope.judge.contract import load_contract
    from driftscope.model.blas import mlx_blas
    from driftscope.taps.stages import StageSelection
    from make_3b_shaped import ensure_3b_shaped

    print(f"MLX BLAS: {mlx_blas()}")
    if args.narrowing:
        path = ensure_3b_shaped() if args.narrowing == "3b" else Path(args.narrowing)
        narrowing_budget(open_checkpoint(path), Path(args.out or tempfile.mkdtemp(prefix="driftscope-bench-")))
        return
    checkpoint = open_checkpoint(ensure_3b_shaped())
    out = Path(args.out or tempfile.mkdtemp(prefix="driftscope-bench-"))
    os.environ["DRIFTSCOPE_CACHE"] = str(out / "cache")  # cold IREE compiles
    rss = PeakRSS()
    image = ROOT / "fixtures" / "images" / "shapes_448.png"
    inputs = prepare_inputs(checkpoint, [image])
    full = stage_plan(checkpoint.family, checkpoint.config)
    plans = {"blocks": full.select(StageSelection(blocks=True)), "substages": full.select(StageSelection.everything())}
    weights_bytes = sum(p.stat().st_size for p in checkpoint.path.glob("*.safetensors"))
    if args.investigation:
        forwards = {}
        for name, policy in RUNTIMES:
            runtime = get_runtime(name)(checkpoint, policy)
            runtime.load()
            plain_forward(runtime, inputs, out)  # warm-up (and the cold IREE compile of the production-like graph)
            seconds = [plain_forward(runtime, inputs, out) for _ in range(REPEATS)]
            forwards[f"{name}:{policy}"] = statistics.median(seconds)
            runtime.release()
            del runtime
            gc.collect()
        total = sum(forwards.values())
        investigation_s, investigation_rss, _ = whole_investigation(checkpoint.path, image, out)
        print(
            "plain forwards (median of 3): "
            + ", ".join(f"{label} {s:.2f}s" for label, s in forwards.items())
            + f"\nwhole investigation (warm): {investigation_s:.1f}s = {investigation_s / total:.2f}x the sum of "
            f"the three plain forwards ({total:.1f}s); its process peaked at {gib(investigation_rss)} GiB"
        )
        return
    rows: dict[str, dict] = {}
    substage_taps = {}

    def tapped(runtime, kind: str, label: str, rep: int):
        return tapped_capture(runtime, inputs, plans[kind], out / f"{label.replace(' ', '-')}-{kind}-{rep}")

    def warm_compile(runtime) -> float:
        """A second compile of the production-like graph: the cache lookup and module load."""
        from driftscope.capture.iree import IreeModule, compile_graph
        from driftscope.families.qwen2_5_vl.geometry import pack_images
        from driftscope.families.qwen2_5_vl.jax.program import lower_vision_tower
        from driftscope.model.policies import get_policy

        rows_ = pack_images(inputs["grid_thw"]).rows
        spec, weights = runtime.model.spec, runtime.model.weights  # lowering reads their shapes only
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
        plain_forward(runtime, inputs, out)  # warm-up (and the cold IREE compile of the production-like graph)
        cold = runtime.timings.get("compile_s")
        pairs = []  # plain and all-blocks-tapped forwards alternate, so drift in machine speed hits both alike
        for rep in range(REPEATS):
            forward = plain_forward(runtime, inputs, out)
            pairs.append((forward, tapped(runtime, "blocks", label, rep)[1]))
        row = {
            "plain_s": statistics.median(p for p, _ in pairs),
            "blocks_s": statistics.median(t for _, t in pairs),
            "blocks_ratio": statistics.median(t / p for p, t in pairs),
            "compile_cold_s": cold if name == "iree" else None,
            "compile_warm_s": warm_compile(runtime) if name == "iree" else None,
        }
        substage_taps[label], row["substages_s"] = tapped(runtime, "substages", label, 0)
        row["peak_rss"] = rss.peak
        runtime.release()
        del runtime
        gc.collect()
        rows[label] = row
        print(f"  {label}: {row}", flush=True)

    contract = load_contract(None)
    start = time.perf_counter()
    reference = substage_taps["transformers:f32"]
    for label in ("mlx:f32", "iree:f32"):
        compare_tapsets(reference, substage_taps[label], contract, plans["substages"])
    compare_s = time.perf_counter() - start
    largest = max(reference.shape(s)[0] * math.prod(reference.shape(s)[1:]) * 4 for s in reference.stage_ids())
    # drop this run's ~17 GB of taps, so the investigation below does not pay for the page cache they hold
    del reference
    substage_taps.clear()
    gc.collect()
    for path in out.glob("*.safetensors"):
        path.unlink()
    # what three hand-rolled parity scripts cost: one fresh process per runtime (imports, load, one forward)
    scripts = {}
    for name, policy in RUNTIMES:
        start = time.perf_counter()
        run_child(f"{name}:{policy}", "plain", [str(image)], out, checkpoint.path)
        scripts[f"{name}:{policy}"] = time.perf_counter() - start

    investigation_s, investigation_rss, report = whole_investigation(checkpoint.path, image, out)
    render_s = investigation_s - sum(
        r["timings"].get("capture_s", 0) + r["timings"].get("load_s", 0) for r in report.data["runtimes"]
    )

    print(
        f"\n3B-shaped vision tower (depth 32, hidden 1280), image {image.name} -> grid {inputs['grid_thw'].tolist()}, "
        f"{inputs['pixel_values'].shape[0]} patches; weights {gib(weights_bytes)} GiB f32; MLX BLAS: {mlx_blas()}\n"
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
            f"{r['blocks_ratio']:.3f}x | {r['substages_s'] / r['plain_s']:.3f}x | {cold} | {warm} | "
            f"{gib(r['peak_rss'])} |"
        )
    forwards = sum(rows[label]["plain_s"] for label in ("transformers:f32", "mlx:f32", "iree:f32"))
    iree = rows["iree:f32"]
    print(
        f"\ncomparison of every substage, two pairs: {compare_s:.1f}s; largest stage tensor {largest / 2**20:.1f} MiB"
    )
    print(
        f"whole investigation (warm, 3 runtimes, blocks + substages of 2 layers, compare, report, HTML): "
        f"{investigation_s:.1f}s = {investigation_s / forwards:.2f}x the sum of the three plain forwards "
        f"({forwards:.1f}s); loading, notebook and rendering outside the captures: {render_s:.1f}s; "
        f"its process peaked at {gib(investigation_rss)} GiB"
    )
    print(
        "three plain parity scripts (a fresh process per runtime: imports, load, one forward): "
        + ", ".join(f"{label} {seconds:.1f}s" for label, seconds in scripts.items())
        + f" = {sum(scripts.values()):.1f}s; the investigation is {investigation_s / sum(scripts.values()):.2f}x that"
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
    sweep(checkpoint, image, out)


def whole_investigation(checkpoint: Path, image: Path, out: Path):
    """(seconds, peak RSS bytes, report) of ``driftscope run`` in a fresh process, warm: three runtimes, all
    blocks, substages of two layers, comparison, report, notebook and HTML. A first run compiles the tapped
    IREE graph; the second is timed."""
    import subprocess

    import yaml
    from driftscope.run.report import Report

    params = out / "bench.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "name": "bench-3b",
                "checkpoint": str(checkpoint),
                "images": [str(image)],
                "runtimes": [f"{n}:{p}" for n, p in RUNTIMES],
                "stages": {"blocks": True, "substages": [0, 7]},
                "replay": False,
                "notebooks": ["01_stage_parity"],
            }
        )
    )
    for attempt in ("cold", "warm"):  # as a user runs it: a fresh process, which pays for its own imports
        target = out / f"investigation-{attempt}"
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "driftscope", "run", str(params), "--out", str(target), "--force", "--no-gate"]
        )
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory (its kernel is a separate process)
        seconds = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"driftscope run {params} failed ({os.waitstatus_to_exitcode(status)})")
    return seconds, usage.ru_maxrss * 1024, Report.load(out / "investigation-warm" / "report.json")


def narrowing_budget(checkpoint, out: Path, repeats: int = 3) -> None:
    """The same block-level investigation (every block output tapped, no substages asked for, same-input replay)
    with ``narrow: true`` and ``narrow: false``, alternating, each ``driftscope run`` in a fresh process; the
    candidate (MLX f32) carries a defect planted in block depth/2 + 1's norm2, so the run with narrowing captures
    that block's substages on both sides and replays them. Prints both medians and their ratio."""
    import subprocess

    import yaml
    from driftscope.run.report import Report

    out.mkdir(parents=True, exist_ok=True)
    depth = int((checkpoint.config.get("vision_config") or {}).get("depth", 32))
    stage = f"vision.block.{depth // 2 + 1}.norm2"
    image = ROOT / "fixtures" / "images" / "shapes_448.png"
    patch = {"callable": "driftscope.families.hypotheses:plant_defect", "kwargs": {"stage": stage, "factor": 1.5}}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    reports = {}
    for attempt in range(repeats + 1):  # the first pair warms the page cache and the imports; not counted
        for narrow in (False, True):
            params = out / f"narrow-{narrow}.yaml"
            params.write_text(
                yaml.safe_dump(
                    {
                        "name": f"bench-narrow-{narrow}",
                        "checkpoint": str(checkpoint.path),
                        "images": [str(image)],
                        "runtimes": ["transformers:f32", {"runtime": "mlx", "label": "planted", "patch": patch}],
                        "stages": {"blocks": True},
                        "narrow": narrow,
                        "notebooks": [],
                    }
                )
            )
            target = out / f"narrow-{narrow}"
            start = time.perf_counter()
            command = [sys.executable, "-m", "driftscope", "run", str(params), "--out", str(target), "--force"]
            done = subprocess.run(command + ["--no-gate"], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            if attempt:
                seconds[narrow].append(time.perf_counter() - start)
            reports[narrow] = Report.load(target / "report.json")
    narrowed = reports[True].data["narrowing"].get("planted") or {}
    steps = narrowed.get("steps", [])
    plain, narrow = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(
        f"\nnarrowing budget on {checkpoint.path.name} (depth {depth}), image {image.name}, defect planted in {stage}; "
        f"median of {repeats} fresh-process runs each\n"
    )
    print("| run | seconds (median) | runs | first introduced | stages narrowing added |")
    print("|---|---|---|---|---|")
    for flag, median in ((False, plain), (True, narrow)):
        replay = reports[flag].data["replay"]["planted"]
        added = len((reports[flag].data["narrowing"].get("planted") or {}).get("added", []))
        runs = ", ".join(f"{value:.1f}" for value in seconds[flag])
        print(f"| narrow: {str(flag).lower()} | {median:.2f} | {runs} | {replay['first_introduced']} | {added} |")
    print(
        f"\nwith narrowing / without: {narrow / plain:.3f}x (target <= 1.2x); the narrowing steps themselves "
        f"(both sides' substages re-run from their stored block input, compared): "
        + ", ".join(f"{step['target']} {step.get('seconds', 0.0):.2f}s" for step in steps)
    )


def plain_forward(runtime, inputs, out: Path) -> float:
    """Seconds of one forward without taps; IREE's is the production-like graph (the whole tower with only
    the final output), timed without compiling."""
    if runtime.name != "iree":
        start = time.perf_counter()
        runtime.run_vision(inputs)
        return time.perf_counter() - start
    from driftscope.families import stage_plan
    from driftscope.taps.stages import StageSelection

    options = dict(runtime.options)
    runtime.options.update(taps="final", graph="whole")
    final = stage_plan(runtime.checkpoint.family, runtime.checkpoint.config).select(StageSelection(blocks=False))
    runtime.capture(inputs, final, out / "plain-iree")
    runtime.options.clear()
    runtime.options.update(options)
    return runtime.timings["run_s"]


def tapped_capture(runtime, inputs, plan, out_base: Path):
    """(TapSet, seconds) of one capture of ``plan``; IREE's seconds leave out lowering and compiling."""
    tapset = runtime.capture(inputs, plan, out_base)
    return tapset, runtime.timings["run_s"] if runtime.name == "iree" else runtime.timings["capture_s"]


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares exponent of ``ys`` against ``xs`` on a log-log scale."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / sum((x - mx) ** 2 for x in lx)


def measure_one(runtime_spec: str, kind: str, images: list[str], out: Path, checkpoint_path: Path) -> dict:
    """In a fresh process: load one runtime, run one plain forward or one all-blocks capture; report seconds,
    resident memory after the load, the peak, and the working memory: the peak above the imports and the
    resident weights (transformers maps its weights lazily, so they count once the forward touches them)."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.taps.stages import StageSelection

    checkpoint = open_checkpoint(checkpoint_path)
    inputs = prepare_inputs(checkpoint, images)
    name, policy = runtime_spec.split(":")
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection(blocks=True))
    runtime = get_runtime(name)(checkpoint, policy)
    weights = sum(p.stat().st_size for p in checkpoint.path.glob("*.safetensors"))
    before = PeakRSS.now()
    runtime.load()
    rss = PeakRSS()
    loaded = rss.now()
    rss.reset()
    if kind == "plain":
        seconds = plain_forward(runtime, inputs, out)
    else:
        seconds = tapped_capture(runtime, inputs, plan, out / f"{name}-{kind}")[1]
    return {
        "patches": int(inputs["pixel_values"].shape[0]),
        "seconds": seconds,
        "loaded": loaded,
        "peak": rss.peak,
        "working": rss.peak - max(loaded, before + weights),
    }


def run_child(runtime_spec: str, kind: str, images: list[str], out: Path, checkpoint: Path) -> dict:
    """``measure_one`` in a fresh interpreter; its JSON line back."""
    import json
    import subprocess

    command = [sys.executable, __file__, "--one", runtime_spec, kind, "--out", str(out / "one")]
    command += ["--checkpoint", str(checkpoint), "--images", *images]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sweep(checkpoint, image: Path, out: Path) -> None:
    """Each runtime, case and kind (plain forward, all block outputs tapped) in its own process."""
    from PIL import Image

    print("\n## How cost grows (plain forward and all-block-taps capture, each in a fresh process)\n")
    cases = [(f"{s}x{s}", [s]) for s in (224, 448, 672, 896)] + [("2 x 448", [448, 448]), ("4 x 448", [448] * 4)]
    results: dict[str, list] = {}
    for case, sizes in cases:
        paths = []
        for i, side in enumerate(sizes):
            path = out / f"img-{side}-{i}.png"
            with Image.open(image) as picture:
                picture.resize((side, side)).rotate(90 * i).save(path)
            paths.append(str(path))
        for name, policy in RUNTIMES:
            point = {"case": case}
            for kind in ("plain", "tapped"):
                measured = run_child(f"{name}:{policy}", kind, paths, out, checkpoint.path)
                point.update({f"{kind}_{key}": value for key, value in measured.items()}, patches=measured["patches"])
            results.setdefault(f"{name}:{policy}", []).append(point)
            print(
                f"  {case} {name}: {point['patches']} patches, forward {point['plain_seconds']:.2f}s, "
                f"tapped {point['tapped_seconds']:.2f}s, working memory {gib(point['plain_working'])} / "
                f"{gib(point['tapped_working'])} GiB",
                flush=True,
            )
    print(
        "\n| runtime | case | patches | plain forward s | all blocks tapped s | tapped / plain | peak RSS GiB | "
        "forward working memory GiB | tapped working memory GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, points in results.items():
        for p in points:
            print(
                f"| {label} | {p['case']} | {p['patches']} | {p['plain_seconds']:.2f} | {p['tapped_seconds']:.2f} | "
                f"{p['tapped_seconds'] / p['plain_seconds']:.2f}x | {gib(p['tapped_peak'])} | "
                f"{gib(p['plain_working'])} | {gib(p['tapped_working'])} |"
            )
    print(
        "\nobserved exponents against patch count (single images; log-log least squares; working memory only over"
        f" the cases where both kinds hold at least {NOISE_FLOOR_MIB} MiB, below that it is allocator noise):"
    )
    for label, points in results.items():
        print(f"  {label}: " + exponents([p for p in points if " " not in p["case"]]))


def exponents(single: list[dict]) -> str:
    """Time and working-memory exponents of the plain forward and the tapped capture against patches."""
    xs = [p["patches"] for p in single]
    time_fit = {kind: slope(xs, [p[f"{kind}_seconds"] for p in single]) for kind in ("plain", "tapped")}
    floor = NOISE_FLOOR_MIB * 2**20
    big = [p for p in single if min(p["plain_working"], p["tapped_working"]) >= floor]
    if len(big) < 2:
        memory = "working memory under the noise floor in all but one case"
    else:
        fit = {kind: slope([p["patches"] for p in big], [p[f"{kind}_working"] for p in big]) for kind in time_fit}
        memory = (
            f"working memory ({', '.join(p['case'] for p in big)}): forward ~ patches^{fit['plain']:.2f}, "
            f"tapped ~ patches^{fit['tapped']:.2f}"
        )
    return f"time: forward ~ patches^{time_fit['plain']:.2f}, tapped ~ patches^{time_fit['tapped']:.2f}; {memory}"


if __name__ == "__main__":
    main()
