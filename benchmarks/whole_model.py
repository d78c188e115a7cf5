"""The whole Qwen2.5-VL-3B-shaped model (vision and language) through every runtime: plain whole-model
forwards, the `driftscope run` investigation, its peak memory, IREE's text-decoder compile, and how the
text side's cost grows with the prompt. Targets 1-5 of issue 22, measured side by side in one run.

    .venv/bin/python benchmarks/whole_model.py --scale 4      # the ~1.2 GB variant (widths / 4)
    .venv/bin/python benchmarks/whole_model.py                # the real 3B shape (~15 GB f32; 24 GiB machine)
    .venv/bin/python benchmarks/whole_model.py --scale 4 --skip-sweep --repeats 1

Generates the checkpoints on first use (benchmarks/make_3b_shaped.py --whole, outside the repo). One model
is resident at a time in this process; the investigation and each sweep case run in fresh processes.
Prints Markdown tables; ``--out`` keeps the run's outputs (default: a temp dir).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_size import PeakRSS, gib, plain_forward, slope, tapped_capture  # noqa: E402

#: the investigation's runtimes (the first is the reference); the first three are the f32 runtimes
WHOLE_RUNTIMES = ("transformers:f32", "mlx:f32", "iree:f32", "mlx:bf16", "iree:f16-contract")
F32 = WHOLE_RUNTIMES[:3]
TOKENS = 8
SWEEP_LENGTHS = (128, 512, 2048)
IMAGE = ROOT / "fixtures" / "images" / "shapes_448.png"


def iree_options(target: str) -> dict:
    """Runtime options for ``iree`` on ``target`` (llvm-cpu: none, the default)."""
    return {} if target == "llvm-cpu" else {"target": target}


def whole_params(
    checkpoint: Path, image: Path, runtimes=WHOLE_RUNTIMES, tokens: int = TOKENS, target: str = "llvm-cpu", **extra
) -> dict:
    """The whole-model investigation: every vision block, merged embeddings, every text layer's last
    position, prefill logits and ``tokens`` greedy tokens, one image."""
    return {
        "name": "bench-whole",
        "checkpoint": str(checkpoint),
        "images": [str(image)],
        "runtimes": [
            {"runtime": "iree", "policy": r.split(":")[1], "options": iree_options(target)}
            if r.startswith("iree:") and iree_options(target)
            else r
            for r in runtimes
        ],
        "stages": {"blocks": True},
        "text": {"max_new_tokens": tokens},
        "replay": False,
        "notebooks": ["01_stage_parity", "06_answer_parity"],
        **extra,
    }


def whole_plan(checkpoint, tokens: int = TOKENS):
    """The investigation's stage plan: every block output and the text stages."""
    from driftscope.families import get_family
    from driftscope.taps.stages import StagePlan, StageSelection

    family = get_family(checkpoint.family)
    vision = family.vision_plan(checkpoint.config).select(StageSelection(blocks=True))
    text = family.text_stages(checkpoint.config, tokens)
    return StagePlan(vision.family, vision.stages + text, vision.depth, dict(vision.meta))


def with_text(checkpoint, images: list, prompt: str | None = None, tokens: int = TOKENS):
    from driftscope.families import get_family

    family = get_family(checkpoint.family)
    inputs = family.prepare_inputs(checkpoint, images)
    inputs.text = family.text_inputs(
        checkpoint, inputs, **({"prompt": prompt} if prompt else {}), max_new_tokens=tokens
    )
    return inputs


def plain_whole(runtime, inputs, out: Path) -> float:
    """Seconds of one plain whole-model forward without taps: tower, prefill (last position's logits) and
    greedy decode to ``max_new_tokens`` (IREE: the production-like tower graph, the compiled prefill and its
    compiled decode step)."""
    text = inputs.text
    if runtime.name == "transformers":
        import torch

        model = runtime.model
        start = time.perf_counter()
        with torch.no_grad():
            pixels = torch.from_numpy(inputs["pixel_values"]).to(next(model.parameters()).dtype)
            step = model(
                input_ids=torch.from_numpy(text.input_ids)[None],
                pixel_values=pixels,
                image_grid_thw=torch.from_numpy(inputs["grid_thw"]),
                mm_token_type_ids=torch.from_numpy(text.mm_token_type_ids)[None],
                use_cache=True,
                logits_to_keep=1,
            )
            cache = step.cache
            for _ in range(text.max_new_tokens - 1):
                token = int(step.logits[0, -1].argmax())
                step = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        return time.perf_counter() - start
    if runtime.name == "mlx":
        import mlx.core as mx
        from mlx_vlm.models.cache import make_prompt_cache

        model = runtime.model
        start = time.perf_counter()
        dtype = model.vision_tower.patch_embed.proj.weight.dtype
        pixels, grid = mx.array(inputs["pixel_values"]).astype(dtype), mx.array(inputs["grid_thw"])
        cache = make_prompt_cache(model.language_model)
        logits = model(mx.array(text.input_ids[None]), pixel_values=pixels, cache=cache, image_grid_thw=grid).logits
        for _ in range(text.max_new_tokens - 1):
            token = int(mx.argmax(logits[0, -1]).item())
            logits = model.language_model(mx.array([[token]]), cache=cache).logits
        mx.eval(logits)
        return time.perf_counter() - start
    from driftscope.families import get_family
    from driftscope.taps.stages import StagePlan, StageSelection

    family = get_family(runtime.checkpoint.family)
    vision = family.vision_plan(runtime.checkpoint.config).select(StageSelection(blocks=False))
    text_stages = family.text_stages(runtime.checkpoint.config, text.max_new_tokens)
    plan = StagePlan(vision.family, vision.stages + text_stages, 0, {})
    options = dict(runtime.options)
    runtime.options.update(taps="final", graph="whole")
    runtime.capture(inputs, plan, out / f"plain-{runtime.name}")
    runtime.options.clear()
    runtime.options.update(options)
    return runtime.timings["capture_s"] - runtime.timings.get("lower_s", 0.0) - runtime.timings.get("compile_s", 0.0)


def tapped_whole(runtime, inputs, plan, out: Path) -> float:
    """Seconds of one capture of the investigation's plan (IREE: without lowering and compiling)."""
    runtime.capture(inputs, plan, out)
    seconds = runtime.timings["capture_s"]
    if runtime.name == "iree":
        seconds -= runtime.timings.get("lower_s", 0.0) + runtime.timings.get("compile_s", 0.0)
    return seconds


def forced_cost(runtime, inputs, plan, out: Path, repeats: int = 1) -> dict:
    """Issue 33's cost target: seconds of one capture of ``plan`` (every tap, the forced logits streamed) when the
    runtime is fed tokens equal to its own greedy ones (the forced pass shares every step) and when it is fed
    tokens that differ from step 1 on (the worst case: the cache rewound after the prefill and ``steps - 1``
    more decode steps), next to a plain greedy decode of the same length (``plain_whole``). ``repeats`` pairs per
    kind, plain and forced alternating (medians; the spread is the min and max ratio)."""
    import copy

    import numpy as np

    own = copy.copy(inputs)
    own.text = copy.copy(inputs.text)
    own.text.forced = None
    tapset = runtime.capture(own, plan, out / "forced-own")
    greedy = np.asarray(tapset["text.generate.tokens"])
    seconds = {}
    for kind, tokens in (("agree", greedy), ("differ", np.concatenate([greedy[:1], (greedy[1:] + 1) % 1000]))):
        own.text.forced = tokens
        pairs = []
        for rep in range(repeats):
            plain = plain_whole(runtime, inputs, out)  # free-running greedy: not fed the forced tokens
            runtime.capture(own, plan, out / f"forced-{kind}-{rep}")
            timings = runtime.timings
            pairs.append((plain, timings["capture_s"] - timings.get("lower_s", 0.0) - timings.get("compile_s", 0)))
        ratios = [f / p for p, f in pairs]
        seconds[f"{kind}_s"] = statistics.median(f for _, f in pairs)
        seconds[f"{kind}_ratio"] = statistics.median(ratios)
        seconds[f"{kind}_ratio_range"] = (min(ratios), max(ratios))
        seconds["plain_s"] = statistics.median(p for p, _ in pairs)
    return seconds


def forced_only(args, checkpoint, inputs, plan, out: Path, labels: list[str]) -> None:
    """Issue 33's figure alone: per f32 runtime, load once, warm up, then ``forced_cost`` with ``args.repeats``
    alternating pairs; prints one Markdown row per runtime."""
    from driftscope.capture.runtimes import get_runtime

    print(f"checkpoint {checkpoint.path}, {TOKENS} tokens, {args.repeats} pairs per kind (medians, range)")
    print(FORCED_HEADER)
    for label in labels:
        name, policy = label.split(":")
        options = iree_options(args.iree_target) if name == "iree" else {}
        runtime = get_runtime(name)(checkpoint, policy, options=options)
        runtime.load()
        plain_whole(runtime, inputs, out)  # warm-up (and IREE's compiles)
        f = forced_cost(runtime, inputs, plan, out, args.repeats)
        runtime.release()
        del runtime
        gc.collect()
        for file in out.glob("**/*.safetensors"):
            file.unlink()
        print(forced_row(label, f), flush=True)


FORCED_HEADER = (
    "| runtime | plain greedy s | forced, agreeing s | ratio (range) | forced, differing s | ratio (range) |\n"
    "|---|---|---|---|---|---|"
)


def forced_row(label: str, f: dict) -> str:
    """One Markdown row of ``forced_cost``'s figures."""
    spread = {k: "{:.2f}-{:.2f}".format(*f[f"{k}_ratio_range"]) for k in ("agree", "differ")}
    return (
        f"| {label} | {f['plain_s']:.2f} | {f['agree_s']:.2f} | {f['agree_ratio']:.2f} ({spread['agree']}) "
        f"| {f['differ_s']:.2f} | {f['differ_ratio']:.2f} ({spread['differ']}) |"
    )


def text_compile(runtime, inputs, cache: Path) -> dict:
    """Target 4: the text decoder's prefill lowered and iree-compiled cold (fresh cache), then warm (cache
    hit and module load); whether its weights are arguments (argument count, largest constant, vmfb size)."""
    import jax
    import numpy as np
    from driftscope.capture.iree import IreeModule, compile_graph
    from driftscope.families.qwen2_5_vl.jax.program import _text
    from driftscope.families.qwen2_5_vl.jax.text import text_prefill
    from driftscope.taps.jax.graph import lower_function

    runtime.load()
    spec, weights = _text(runtime.model)  # the runtime's own text weights (read once; only their shapes are used)
    seq, contract = int(inputs.text.input_ids.size), runtime.contract
    function = jax.jit(lambda w, e, p: text_prefill(w, e, p, spec=spec, contract=contract), keep_unused=True)
    function.__name__ = "text_prefill"
    shapes = (
        {k: jax.ShapeDtypeStruct(v.shape, np.float32) for k, v in weights.items()},
        jax.ShapeDtypeStruct((seq, spec.hidden_size), np.float32),
        jax.ShapeDtypeStruct((3, seq), np.int32),
    )
    start = time.perf_counter()
    graph = lower_function(function, shapes, runtime.policy)
    lower_s = time.perf_counter() - start
    timings = {}
    for attempt in ("cold", "warm"):
        start = time.perf_counter()
        artifact = compile_graph(graph, runtime.target, cache)
        IreeModule(artifact, graph.output_names)
        timings[attempt] = time.perf_counter() - start
        assert artifact.cache_hit == (attempt == "warm")
    main = re.search(r"func\.func public @main\((.*?)\)\s*->", graph.text, re.S)
    arguments = main.group(1).count("%arg") if main else -1
    constants = [
        int(np.prod([int(d) for d in dims.split("x") if d.isdigit()] or [1]))
        for dims in re.findall(r"stablehlo\.constant dense.*?: tensor<([0-9x]*)[a-z]", graph.text)
    ]
    leaves = len(jax.tree_util.tree_leaves(shapes[0]))
    return {
        "layers": spec.layers,
        "tokens": seq,
        "lower_s": lower_s,
        "cold_s": timings["cold"],
        "warm_s": timings["warm"],
        "arguments": arguments,
        "expected_arguments": leaves + 2,
        "largest_constant_elements": max(constants, default=0),
        "vmfb_bytes": artifact.path.stat().st_size,
        "weight_bytes": sum(int(np.prod(v.shape)) * 4 for v in {id(v): v for v in weights.values()}.values()),
    }


class ChildMemory:
    """Samples a child process's resident memory every 50 ms; notes it whenever the run's log says a capture
    starts (``capture LABEL: ...``), so a runtime left resident beside the next one would show. ``hwm`` is the
    child's own high-water mark (``VmHWM``: every spike since its exec, not only the sampled ones). Not
    ``ru_maxrss`` from ``wait4``: Linux carries the spawning process's high-water mark across vfork + exec, so a
    child of this benchmark (which held a whole model) would report the benchmark's peak."""

    def __init__(self, pid: int, log: Path):
        import psutil

        self.process, self.log = psutil.Process(pid), log
        self.peak, self.hwm, self.at_capture = 0, 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                rss = self.process.memory_info().rss
                status = Path(f"/proc/{self.process.pid}/status").read_text()
            except Exception:  # noqa: BLE001 - the child has exited
                return
            self.peak = max(self.peak, rss)
            found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
            self.hwm = max(self.hwm, int(found.group(1)) * 1024 if found else 0)
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            for label in re.findall(r"\] capture (\S+): ", text):
                self.at_capture.setdefault(label, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_investigation(params: dict, out: Path, tag: str, attempts: tuple[str, ...] = ("cold", "warm")) -> dict:
    """`driftscope run` in a fresh process (as a user runs it), cold then warm; the warm run's seconds, peak
    RSS (ru_maxrss and sampled), RSS when each capture started, and its report."""
    import yaml
    from driftscope.run.report import Report

    path = out / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(params))
    result = {}
    for attempt in attempts:
        target = out / f"{tag}-{attempt}"
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "driftscope", "run", str(path), "--out", str(target), "--force", "--no-gate"]
        )
        memory = ChildMemory(child.pid, target / "investigation.log")
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        memory.stop()
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"driftscope run {path} failed ({os.waitstatus_to_exitcode(status)})")
        result[attempt] = {
            "seconds": seconds,
            "maxrss": usage.ru_maxrss * 1024,
            "hwm": memory.hwm,
            "sampled_peak": memory.peak,
            "rss_at_capture": memory.at_capture,
        }
    result["report"] = Report.load(out / f"{tag}-{attempts[-1]}" / "report.json")
    return result


def investigation_samples(params: dict, out: Path, tag: str, samples: int) -> dict:
    """``samples`` warm runs of the investigation, one after the other: the median run as ``warm`` (its seconds,
    memory), every sample's seconds and VmHWM, and the median run's report."""
    attempts = ("warm",) if samples == 1 else tuple(f"warm{i + 1}" for i in range(samples))
    result = run_investigation(params, out, tag, attempts)
    runs = [result[a] for a in attempts]
    median = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    result["warm"] = median
    result["samples"] = [{"seconds": r["seconds"], "hwm": r["hwm"]} for r in runs]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (1: the real 3B shape)")
    parser.add_argument("--out", help="keep outputs here")
    parser.add_argument("--repeats", type=int, default=3, help="plain/tapped pairs per runtime (medians)")
    parser.add_argument("--skip-sweep", action="store_true", help="without the prompt-length sweep")
    parser.add_argument(
        "--tower-investigation", action="store_true", help="also the tower-only investigation (target 3's ratio)"
    )
    parser.add_argument("--sweep-only", action="store_true", help="only the prompt-length sweep")
    parser.add_argument(
        "--forced", action="store_true", help="also time teacher-forced decoding (issue 33: at most 1.2x greedy)"
    )
    parser.add_argument(
        "--forced-only", action="store_true", help="only the teacher-forced cost of the f32 runtimes (--repeats pairs)"
    )
    parser.add_argument(
        "--investigation-repeats", type=int, default=1, help="warm runs of the whole investigation (median, spread)"
    )
    parser.add_argument(
        "--skip-tapped", action="store_true", help="plain whole forwards only (no tapped capture beside each)"
    )
    parser.add_argument(
        "--plain-only",
        action="store_true",
        help="only each runtime's load, first and plain forwards (the baselines; implies --skip-tapped "
        "--skip-substages, no --forced, no text compile timing)",
    )
    parser.add_argument("--forced-repeats", type=int, help="pairs per kind for --forced (default: --repeats)")
    parser.add_argument(
        "--skip-substages", action="store_true", help="without the every-substage tower pairs (target 3)"
    )
    parser.add_argument("--iree-target", default="llvm-cpu", help="IREE target (cuda on a GPU machine)")
    parser.add_argument("--one", nargs=3, metavar=("RUNTIME", "KIND", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help="a whole checkpoint to use instead of the generated one")
    parser.add_argument(
        "--contract",
        help="the investigation's tolerance contract (default: strict where every runtime is float32, the contract "
        "`driftscope init` advises for a float32 port, else driftscope's default)",
    )
    parser.add_argument(
        "--runtimes",
        default=",".join(WHOLE_RUNTIMES),
        help="runtime:policy labels, comma-separated: the three f32 runtimes (reference first) and any of the others",
    )
    args = parser.parse_args(argv)
    if args.plain_only:
        args.skip_tapped = args.skip_substages = True
        args.forced = False
    runtimes = tuple(args.runtimes.split(","))
    if runtimes[0] != WHOLE_RUNTIMES[0] or not set(F32) <= set(runtimes) <= set(WHOLE_RUNTIMES):
        parser.error(f"--runtimes: {', '.join(F32)} (the reference first), then any of {', '.join(WHOLE_RUNTIMES[3:])}")
    if args.one:
        from driftscope.model.blas import mlx_blas

        mlx_blas()
        runtime, kind, length = args.one
        print(json.dumps(sweep_case(runtime, kind, int(length), Path(args.out), Path(args.checkpoint))))
        return

    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.model.blas import mlx_blas
    from driftscope.taps.stages import StageSelection
    from make_3b_shaped import ensure_whole

    print(f"MLX BLAS: {mlx_blas()}")
    if args.checkpoint:  # another whole checkpoint (its bf16 copy, if any, next to it as DIR-bf16)
        path = Path(args.checkpoint)
        bf16_path = path.with_name(path.name + "-bf16")
    else:
        path, bf16_path = ensure_whole(args.scale)
    checkpoint = open_checkpoint(path)
    out = Path(args.out or tempfile.mkdtemp(prefix="driftscope-whole-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.sweep_only:
        return sweep(checkpoint, out)
    os.environ["DRIFTSCOPE_CACHE"] = str(out / "cache")  # cold IREE compiles
    inputs = with_text(checkpoint, [IMAGE])
    plan = whole_plan(checkpoint)
    substages = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection.everything())
    weights_bytes = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    rss = PeakRSS()
    rows, compile_row = {}, None
    if args.forced_only:
        return forced_only(args, checkpoint, inputs, plan, out, [r for r in runtimes if r in F32])
    for label in runtimes:
        name, policy = label.split(":")
        runtime = get_runtime(name)(
            checkpoint, policy, options=iree_options(args.iree_target) if name == "iree" else {}
        )
        rss.reset()
        start = time.perf_counter()
        runtime.load()
        load_s = time.perf_counter() - start
        first_s = None  # the warm-up: what a one-off plain run pays after its load (lazy reads, compiles)
        if label != "mlx:bf16":  # warm-up (and the cold IREE compiles); MLX bf16 (no BLAS) is too slow to repeat
            first_s = plain_whole(runtime, inputs, out)
        pairs = []
        repeats = args.repeats if label in F32 else 1  # MLX bf16 has no BLAS on the CPU: one pair
        for rep in range(repeats):  # plain and tapped alternate, so drift in machine speed hits both alike
            plain = plain_whole(runtime, inputs, out)
            pairs.append((plain, None if args.skip_tapped else tapped_whole(runtime, inputs, plan, out / f"t-{rep}")))
        tapped = None if args.skip_tapped else statistics.median(t for _, t in pairs)
        row = {"plain_s": statistics.median(p for p, _ in pairs), "tapped_s": tapped}
        row.update(load_s=load_s, first_s=first_s, plain_samples=[p for p, _ in pairs])
        if (
            label in F32 and not args.skip_substages
        ):  # target 3: the tower alone, plain and with every substage of every block tapped
            tower = [
                (plain_forward(runtime, inputs, out), tapped_capture(runtime, inputs, substages, out / "s")[1])
                for _ in range(args.repeats)
            ]
            row["tower_plain_s"] = statistics.median(p for p, _ in tower)
            row["substages_ratio"] = statistics.median(t / p for p, t in tower)
        if args.forced and label in F32:  # issue 33: teacher-forced decoding with all taps vs plain greedy
            row["forced"] = forced_cost(runtime, inputs, plan, out, args.forced_repeats or args.repeats)
        if label == "iree:f32" and not args.plain_only:
            compile_row = text_compile(runtime, inputs, out / "compile-cache")
        row["peak_rss"] = rss.peak
        runtime.release()
        del runtime
        gc.collect()
        for file in out.glob("**/*.safetensors"):
            file.unlink()
        rows[label] = row
        print(f"  {label}: {row}", flush=True)
    if args.plain_only:
        print(one_off_line(rows, []))
        return

    # the captures above compiled every IREE graph the investigation needs into $DRIFTSCOPE_CACHE: it runs warm
    contract = args.contract or ("strict" if all(label.endswith(":f32") for label in runtimes) else None)
    extra = {"contract": contract} if contract else {}
    whole_yaml = whole_params(path, IMAGE, runtimes, target=args.iree_target, **extra)
    whole = investigation_samples(whole_yaml, out, "whole", args.investigation_repeats)
    tower = None
    if args.tower_investigation:
        tower_params = {**whole_params(path, IMAGE, F32), "name": "bench-tower", "notebooks": ["01_stage_parity"]}
        tower_params.update(stages={"blocks": True, "substages": [0, 7]})
        del tower_params["text"]  # as the tower benchmark (benchmarks/real_size.py) runs it
        tower = run_investigation(tower_params, out, "tower")
    report(args, checkpoint, inputs, weights_bytes, bf16_path, rows, compile_row, whole, tower)
    if not args.skip_sweep:
        sweep(checkpoint, out)


def one_off_line(rows: dict, samples: list[dict]) -> str:
    """The investigation's samples against one-off plain runs: each runtime's load and its first forward (the
    run reads every runtime's weights once, transformers and IREE partly at the first forward; a warm forward
    leaves that out)."""

    def first(row: dict) -> float:  # MLX bf16 runs one forward, no warm-up: that one is its first
        return row["plain_s"] if row["first_s"] is None else row["first_s"]

    one_off = sum(r["load_s"] + first(r) for r in rows.values())
    return (
        f"   one-off plain runs {one_off:.1f}s (each runtime's load + first forward: "
        + ", ".join(f"{k} {r['load_s']:.1f} + {first(r):.1f}s" for k, r in rows.items())
        + ")"
        + (": the samples " + ", ".join(f"{s['seconds'] / one_off:.2f}x" for s in samples) if samples else "")
    )


def report(args, checkpoint, inputs, weights_bytes, bf16_path, rows, compile_row, whole, tower) -> None:
    text = checkpoint.config["text_config"]
    vision = checkpoint.config["vision_config"]
    bf16_bytes = sum(p.stat().st_size for p in bf16_path.glob("*.safetensors"))
    print(
        f"\nwhole model, widths / {args.scale}: vision depth {vision['depth']} hidden {vision['hidden_size']}, text "
        f"{text['num_hidden_layers']} layers hidden {text['hidden_size']} heads {text['num_attention_heads']}/"
        f"{text['num_key_value_heads']} MLP {text['intermediate_size']} vocab {text['vocab_size']}; weights "
        f"{gib(weights_bytes)} GiB f32 ({gib(bf16_bytes)} GiB bf16 copy); prompt {inputs.text.input_ids.size} "
        f"tokens ({int(inputs.text.mm_token_type_ids.sum())} image), {TOKENS} greedy tokens\n"
    )
    print(
        "| runtime | plain whole forward s | investigation's capture s | tapped / plain | tower plain s | "
        "every substage / tower plain | peak RSS GiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        tower_cols = f"{r['tower_plain_s']:.2f} | {r['substages_ratio']:.2f}x" if "tower_plain_s" in r else " | "
        tapped = "| " if r["tapped_s"] is None else f"{r['tapped_s']:.2f} | {r['tapped_s'] / r['plain_s']:.2f}x"
        print(f"| {label} | {r['plain_s']:.2f} | {tapped} | {tower_cols} | {gib(r['peak_rss'])} |")
    forwards = sum(r["plain_s"] for r in rows.values())
    f32_forwards = sum(rows[label]["plain_s"] for label in F32)
    warm = whole["warm"]
    data = whole["report"].data
    print(
        f"\n1. whole investigation (warm, {len(rows)} runtimes): {warm['seconds']:.1f}s = "
        f"{warm['seconds'] / forwards:.2f}x the sum of their plain whole forwards ({forwards:.1f}s); "
        f"{warm['seconds'] / f32_forwards:.2f}x the three f32 runtimes' ({f32_forwards:.1f}s); "
        f"verdict {data['verdict']['status']}; " + phases(whole["report"])
    )
    if len(whole.get("samples", ())) > 1:
        ratios = sorted(s["seconds"] / forwards for s in whole["samples"])
        print(
            f"   {len(ratios)} samples: "
            + ", ".join(f"{s['seconds']:.1f}s" for s in whole["samples"])
            + f"; ratio median {statistics.median(ratios):.2f}x, spread {ratios[0]:.2f}-{ratios[-1]:.2f}x; "
            "plain whole forwards per runtime (median of "
            + ", ".join(f"{k} {' / '.join(f'{p:.1f}' for p in r['plain_samples'])}" for k, r in rows.items())
            + ")"
        )
    print("   each runtime's load in this process: " + ", ".join(f"{k} {r['load_s']:.1f}s" for k, r in rows.items()))
    # the run loads every runtime it captures, and each reads its weights then (transformers and IREE partly at
    # their first forward): a one-off plain run pays its load and its first forward, not a warm one
    print(one_off_line(rows, whole.get("samples") or [warm]))
    largest = max(r["peak_rss"] for r in rows.values())
    print(
        f"2. peak RSS of the run process: {gib(warm['hwm'])} GiB (its VmHWM; sampled {gib(warm['sampled_peak'])}; "
        f"wait4's ru_maxrss {gib(warm['maxrss'])} carries this benchmark's own peak across the spawn);"
        f" bound: largest runtime's weights {gib(weights_bytes)} + 1.5 = {gib(weights_bytes + 3 * 2**29)} GiB; "
        + (
            f"every sample's VmHWM {', '.join(gib(s['hwm']) for s in whole['samples'])} GiB; "
            if "samples" in whole
            else ""
        )
        + "RSS when "
        "each capture started: "
        + ", ".join(f"{k} {gib(v)}" for k, v in warm["rss_at_capture"].items())
        + f"; largest per-runtime peak in this process {gib(largest)} GiB"
    )
    if args.skip_substages:
        print("3. (every-substage tower pairs skipped: --skip-substages)")
        f32_tower = None
    else:
        f32_tower = sum(rows[label]["tower_plain_s"] for label in F32)
    investigation = (
        f"tower investigation (warm, 3 f32 runtimes, blocks + substages of 2 blocks): {tower['warm']['seconds']:.1f}s"
        f" = {tower['warm']['seconds'] / f32_tower:.2f}x the three plain tower forwards ({f32_tower:.1f}s); "
        if tower
        else ""
    )
    if f32_tower is not None:
        print(
            f"3. {investigation}every substage / plain tower: "
            + ", ".join(f"{label} {rows[label]['substages_ratio']:.2f}x" for label in F32)
        )
    c = compile_row
    print(
        f"4. IREE text decoder ({c['layers']} layers, {c['tokens']} tokens): lowering {c['lower_s']:.1f}s, "
        f"iree-compile cold {c['cold_s']:.1f}s, warm (cache hit + module load) {c['warm_s']:.3f}s; "
        f"{c['arguments']} arguments for {c['expected_arguments']} expected (weights + embeddings + positions), "
        f"largest constant {c['largest_constant_elements']} elements, vmfb {c['vmfb_bytes'] / 2**20:.1f} MiB for "
        f"{c['weight_bytes'] / 2**30:.2f} GiB of weights"
    )
    forced = {label: r["forced"] for label, r in rows.items() if "forced" in r}
    if forced:
        print("\nteacher-forced decoding (issue 33), every tap, against a plain greedy decode of the same length:")
        print(FORCED_HEADER)
        for label, f in forced.items():
            print(forced_row(label, f))
    answer = data.get("answer", {}).get("runtimes", {})
    print("greedy tokens: " + "; ".join(f"{k} {v.get('tokens')}" for k, v in answer.items()))
    worst = {}
    for row in whole["report"].rows:
        if row.stage.startswith("text.layer") or row.stage == "text.logits.last":
            worst[row.candidate] = max(worst.get(row.candidate, 0.0), row.max_abs)
    print("largest max_abs on text layers and logits: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))


def phases(report) -> str:
    """Where the run's time went: each runtime's load and capture, from its report; the contract and, per
    candidate, whether its answer's evidence was taken and why (``answer_evidence``)."""
    runtimes = report.data["runtimes"]
    evidence = [
        f"{r['label']} {'taken' if r['answer_evidence'].get('teacher_forcing') else 'not taken'}"
        + (f" ({'; '.join(r['answer_evidence']['why'])})" if r["answer_evidence"].get("why") else "")
        for r in runtimes
        if r.get("answer_evidence")
    ]
    return (
        "loads + captures: "
        + ", ".join(
            f"{r['label']} {r['timings'].get('load_s', 0):.1f} + {r['timings'].get('capture_s', 0):.1f}s"
            for r in runtimes
        )
        + f"; contract {report.data.get('contract', {}).get('name', '?')}; answer evidence: "
        + (", ".join(evidence) or "-")
    )


def prompt_of_length(checkpoint, images: list, length: int) -> str:
    """The shortest prompt of repeated shape words whose full chat sequence has at least ``length`` tokens."""
    words = "a red square and a blue circle next to a green triangle".split()
    low, high = 1, 4 * length
    while low < high:
        middle = (low + high) // 2
        prompt = " ".join(words[i % len(words)] for i in range(middle))
        if with_text(checkpoint, images, prompt).text.input_ids.size >= length:
            high = middle
        else:
            low = middle + 1
    return " ".join(words[i % len(words)] for i in range(low))


def sweep_case(label: str, kind: str, length: int, out: Path, checkpoint_path: Path) -> dict:
    """In a fresh process: one runtime, one prompt length (a 224x224 image and words), a plain whole forward
    or a capture of the investigation's plan; seconds, resident memory after the load, peak, working memory."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import open_checkpoint
    from PIL import Image

    checkpoint = open_checkpoint(checkpoint_path)
    image = out / "sweep-224.png"
    if not image.exists():
        with Image.open(IMAGE) as picture:
            picture.resize((224, 224)).save(image)
    inputs = with_text(checkpoint, [image], prompt_of_length(checkpoint, [image], length))
    name, policy = label.split(":")
    runtime = get_runtime(name)(checkpoint, policy)
    before = PeakRSS.now()
    runtime.load()
    if name == "iree":  # the text weights load lazily in the capture; counted with the model instead
        from driftscope.families.qwen2_5_vl.jax.program import _text

        _text(runtime.model)  # read into the runtime's own model (a separate copy would count twice)
    rss = PeakRSS()
    loaded = rss.now()
    rss.reset()
    if kind == "plain":
        seconds = plain_whole(runtime, inputs, out)
    else:
        seconds = tapped_whole(runtime, inputs, whole_plan(checkpoint), out / f"{name}-sweep")
    weights = sum(p.stat().st_size for p in checkpoint.path.glob("*.safetensors"))
    return {
        "tokens": int(inputs.text.input_ids.size),
        "seconds": seconds,
        "loaded": loaded,
        "peak": rss.peak,
        "working": rss.peak - max(loaded, before + weights),
    }


def sweep(checkpoint, out: Path) -> None:
    """Target 5: each f32 runtime, prompt length and kind (plain, tapped) in its own process."""
    print("\n5. how the text side's cost grows (one 224x224 image, words to the length; each case a fresh process)\n")
    results: dict[str, list] = {}
    for label in F32:
        for length in SWEEP_LENGTHS:
            point = {"length": length}
            for kind in ("plain", "tapped"):
                command = [sys.executable, __file__, "--one", label, kind, str(length), "--out", str(out)]
                done = subprocess.run(command + ["--checkpoint", str(checkpoint.path)], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
                measured = json.loads(done.stdout.strip().splitlines()[-1])
                point.update({f"{kind}_{k}": v for k, v in measured.items()}, tokens=measured["tokens"])
            results.setdefault(label, []).append(point)
            print(f"  {label} {point}", flush=True)
    print("| runtime | prompt tokens | plain s | tapped s | tapped / plain | plain working GiB | tapped working GiB |")
    print("|---|---|---|---|---|---|---|")
    for label, points in results.items():
        for p in points:
            print(
                f"| {label} | {p['tokens']} | {p['plain_seconds']:.2f} | {p['tapped_seconds']:.2f} | "
                f"{p['tapped_seconds'] / p['plain_seconds']:.2f}x | {gib(p['plain_working'])} | "
                f"{gib(p['tapped_working'])} |"
            )
    print("\nexponents against prompt tokens (log-log least squares; memory where both exceed 64 MiB):")
    for label, points in results.items():
        xs = [p["tokens"] for p in points]
        fits = [
            f"{kind} time ~ tokens^{slope(xs, [p[f'{kind}_seconds'] for p in points]):.2f}"
            for kind in ("plain", "tapped")
        ]
        big = [p for p in points if min(p["plain_working"], p["tapped_working"]) > 64 * 2**20]
        if len(big) >= 2:
            fits += [
                f"{kind} memory ~ tokens^{slope([p['tokens'] for p in big], [p[f'{kind}_working'] for p in big]):.2f}"
                for kind in ("plain", "tapped")
            ]
        print(f"  {label}: " + ", ".join(fits))


if __name__ == "__main__":
    main()
