"""The screen's cost (issue 35): throughput against the same runtimes' plain forwards, and peak memory in the
number of inputs.

    .venv/bin/python benchmarks/screen.py                     # tiny fixture: throughput on 10 inputs, memory 10 vs 100
    .venv/bin/python benchmarks/screen.py --throughput 24 --memory 10 100 --max-new-tokens 4
    .venv/bin/python benchmarks/screen.py --throughput 0 --memory 10 100 --max-new-tokens 2 --pool 'screen_1*.png'
    .venv/bin/python benchmarks/screen.py --checkpoint PATH   # another checkpoint (e.g. benchmarks/make_3b_shaped.py's)

The parameter file is built here: transformers f32 (reference) and MLX f32 on ``--checkpoint``, the prompt with
``--max-new-tokens`` greedy tokens. Inputs are the built-in screen set (``fixtures/images/screen/*.png``), the
largest image first, repeated with different prompts when more inputs than images are asked for.

- **Throughput**: in one process, (a) the plain forwards: each runtime loaded once, then for every input its
  processor output, the tower and the greedy decode, keeping only the greedy tokens (a capture whose plan is
  ``text.generate.tokens`` alone: the same engine code, none of the screen's taps, teacher-forced pass,
  comparison, scoring or files); (b) the screen of the same inputs into a fresh directory (loads included in
  both). Reported as wall and CPU seconds (this process, every thread: on a shared machine the wall time is
  mostly other people's work), inputs per CPU minute and the ratio screen / plain.
- **Memory**: each count screened in a fresh process (``--child``), its peak resident set (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCREEN_SET = ROOT / "fixtures" / "images" / "screen"
PROMPTS = ["Name every shape in the image and its colour.", "What is in this picture?", "Describe it.", "Colours?"]


def parameters(folder: Path, checkpoint: Path, max_new_tokens: int) -> Path:
    import yaml

    data = {
        "name": "screen-benchmark",
        "checkpoint": str(checkpoint),
        "images": [str(SCREEN_SET / "screen_448x448.png")],
        "runtimes": [{"runtime": "transformers", "policy": "f32"}, {"runtime": "mlx", "policy": "f32"}],
        "stages": {"blocks": True},
        "text": {"prompt": PROMPTS[0], "max_new_tokens": max_new_tokens, "expect": ["square", "circle", "red"]},
    }
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _prompt(round_: int) -> str:
    """The prompt of the ``round_``-th pass over the images: a different one each pass (so no input repeats)."""
    return PROMPTS[round_ % len(PROMPTS)] + (f" (pass {round_})" if round_ >= len(PROMPTS) else "")


def prompt_rows(folder: Path, count: int, pattern: str = "*.png") -> Path:
    """``count`` inputs: the screen set's images matching ``pattern``, largest first, cycled with a new prompt each
    round (every input distinct: a repeated one would be screened once)."""
    from PIL import Image

    def pixels(path: Path) -> int:
        with Image.open(path) as image:
            return image.size[0] * image.size[1]

    images = sorted(SCREEN_SET.glob(pattern), key=lambda p: (-pixels(p), p.name))
    rows = [{"images": [str(images[i % len(images)])], "prompt": _prompt(i // len(images))} for i in range(count)]
    path = folder / f"rows_{count}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def plain_forwards(params_path: Path, rows: Path) -> tuple[float, float]:
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import get_family
    from driftscope.run.params import load_parameters
    from driftscope.screen.capture import Job, model_inputs
    from driftscope.screen.inputs import screen_inputs
    from driftscope.screen.runner import _job
    from driftscope.taps.stages import StagePlan

    params = load_parameters(params_path)
    items = screen_inputs(None, rows, params.text["prompt"], params.text["expect"])
    start, cpu = time.perf_counter(), time.process_time()
    job: Job = _job(params, Path(tempfile.mkdtemp()))
    family = get_family(job.checkpoint.family)
    text = family.text_stages(job.checkpoint.config, params.text["max_new_tokens"])
    plan = StagePlan(
        job.plan.family, [s for s in text if s.id == "text.generate.tokens"], job.plan.depth, job.plan.meta
    )
    with tempfile.TemporaryDirectory() as scratch:
        for spec in job.specs:
            runtime = get_runtime(spec.runtime)(job.checkpoint, spec.policy, spec.patch, {"label": spec.display})
            for index, item in enumerate(items):
                runtime.capture(model_inputs(job, item), plan, Path(scratch) / f"{spec.display}-{index}")
            runtime.release()
    return time.perf_counter() - start, time.process_time() - cpu


def screened(params_path: Path, rows: Path, out: Path) -> tuple[float, float]:
    from driftscope.screen.runner import screen

    start, cpu = time.perf_counter(), time.process_time()
    screen(params_path, None, rows, investigate=False, out=out, log=lambda m: None, advance=lambda label, item: None)
    return time.perf_counter() - start, time.process_time() - cpu


def child(params_path: Path, rows: Path, out: Path) -> None:
    seconds, cpu = screened(params_path, rows, out)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mib": peak_kib / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"))
    parser.add_argument("--throughput", type=int, default=10, help="inputs for the throughput comparison (0: skip)")
    parser.add_argument("--memory", type=int, nargs="*", default=[10, 100], help="input counts for peak memory")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--pool", default="*.png", help="which screen-set images to cycle through (a glob)")
    parser.add_argument("--child", nargs=3, metavar=("PARAMS", "ROWS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*map(Path, args.child))
        return
    folder = Path(tempfile.mkdtemp(prefix="screen-bench-"))
    params = parameters(folder, Path(args.checkpoint), args.max_new_tokens)
    print(
        f"checkpoint {args.checkpoint}; runtimes transformers:f32 (reference), mlx:f32; {args.max_new_tokens} tokens;"
        f" images fixtures/images/screen/{args.pool}"
    )
    if args.throughput:
        rows = prompt_rows(folder, args.throughput, args.pool)
        (plain, plain_cpu), (screen_s, screen_cpu) = plain_forwards(params, rows), screened(params, rows, folder / "t")
        n = args.throughput
        print("\n| inputs | | wall s | CPU s | inputs/min (CPU) |")
        print("|---|---|---|---|---|")
        print(f"| {n} | plain forwards | {plain:.1f} | {plain_cpu:.1f} | {60 * n / plain_cpu:.1f} |")
        print(f"| {n} | screen | {screen_s:.1f} | {screen_cpu:.1f} | {60 * n / screen_cpu:.1f} |")
        print(f"\nscreen / plain: {screen_cpu / plain_cpu:.2f}x CPU time, {screen_s / plain:.2f}x wall time")
    if args.memory:
        print("\n| inputs | wall s | CPU s | peak RSS MiB |")
        print("|---|---|---|---|")
        peaks = []
        for count in args.memory:
            rows = prompt_rows(folder, count, args.pool)
            command = [sys.executable, __file__, "--child", str(params), str(rows), str(folder / f"memory-{count}")]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            peaks.append(result["peak_mib"])
            print(f"| {count} | {result['seconds']:.1f} | {result['cpu_s']:.1f} | {result['peak_mib']:.0f} |")
        if len(peaks) > 1:
            print(f"\npeak at {args.memory[-1]} inputs / at {args.memory[0]}: {peaks[-1] / peaks[0]:.3f}")


if __name__ == "__main__":
    main()
