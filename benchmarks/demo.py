"""The demo against its runtimes' plain forwards (issue 38 item 1): ``make demo`` without its set-up, as a user
runs it, side by side with each of its runtimes run plainly.

    .venv/bin/python benchmarks/demo.py [PARAMS] [--repeats 3]     # default: parameters/demo_shapes.yaml

Each repeat runs, one after the other (so a busy moment falls on both sides):

- **the demo**: ``driftscope run PARAMS --no-gate --force --out <fresh dir>`` in a fresh process (``make demo``'s
  command), every line it prints stamped with the seconds since ``Popen``: the first capture, the verdict, the
  process's exit (the last notebook page written);
- **each runtime plainly**, in a fresh process of its own (``--plain LABEL``): import driftscope's runtime, load the
  checkpoint, prepare the same inputs, one plain whole forward (tower, prefill, greedy decode to the parameter
  file's ``max_new_tokens``; no taps, IREE's production-like graph from the artifact cache), then the same forward
  again, warm. The process's wall time is what running that runtime by hand costs; the warm forward is the
  forward alone.

A first, untimed demo run fills the caches a user's second ``make demo`` finds (IREE artifacts, the reference
taps); each plain process's first forward compiles its graph once, in that untimed warm-up pass too.
Prints Markdown tables for docs/benchmarks.md: the demo's wall time against the sum of the plain processes' and
against the sum of the warm forwards alone, and where the demo's time went (from its stamped lines).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
PARAMS = ROOT / "parameters" / "demo_shapes.yaml"
#: a stamped line of the run's log that starts a step, and the step's name
STEP = re.compile(r"^\[driftscope [0-9:]+\] (capture \S+|replay \S+|narrowed \S+|fixture power|verdict|precision)")


def plain(label: str, params_path: Path) -> dict:
    """In this (fresh) process: ``label``'s load, inputs and two plain whole forwards; seconds of each."""
    start = time.perf_counter()
    import yaml
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import open_checkpoint
    from whole_model import plain_whole, with_text

    params = yaml.safe_load(params_path.read_text())
    name, policy = label.split(":")
    checkpoint = open_checkpoint(ROOT / params["checkpoint"])
    text = params.get("text", {})
    images = [str(ROOT / image) for image in params["images"]]
    inputs = with_text(checkpoint, images, text.get("prompt"), text.get("max_new_tokens", 16))
    runtime = get_runtime(name)(checkpoint, policy, options={})
    ready = time.perf_counter()
    runtime.load()
    loaded = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="driftscope-demo-plain-") as out:
        first = plain_whole(runtime, inputs, Path(out))
        warm = plain_whole(runtime, inputs, Path(out))
    return {
        "label": label,
        "imports_inputs_s": ready - start,
        "load_s": loaded - ready,
        "first_s": first,
        "warm_s": warm,
    }


def stamped(command: list[str]) -> tuple[float, list[tuple[float, str]]]:
    """Run ``command``; its wall seconds and its output lines, each with the seconds since it started."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in child.stdout]
    code = child.wait()
    seconds = time.perf_counter() - start
    if code not in (0, 1):  # 1: the verdict fails, as the demo's does by design (--no-gate keeps it 0)
        tail = "\n".join(line for _, line in lines[-20:])
        raise RuntimeError(f"{' '.join(command)} exited with {code}:\n{tail}")
    return seconds, lines


def demo(params: Path, out: Path) -> dict:
    """One demo run in a fresh process: its wall seconds, first capture, verdict, and the seconds of each step."""
    seconds, lines = stamped(
        [sys.executable, "-m", "driftscope", "run", str(params), "--no-gate", "--force", "--out", str(out)]
    )
    starts = [(at, m.group(1)) for at, line in lines if (m := STEP.match(line))]
    first = next(at for at, step in starts if step.startswith("capture "))
    verdict = next(at for at, step in starts if step == "verdict")
    spans: dict[str, float] = {"start-up (to the first capture)": first}
    for (at, step), (after, _) in zip(starts, starts[1:] + [(verdict, "")], strict=False):
        if step == "verdict":
            break
        kind = step.split()[0] if step != "fixture power" else step
        spans[kind] = spans.get(kind, 0.0) + after - at
    spans["after the verdict (notebooks, pages)"] = seconds - verdict
    return {"seconds": seconds, "first_capture": first, "verdict": verdict, "spans": spans}


def labels_of(params: Path) -> list[str]:
    import yaml

    runtimes = yaml.safe_load(params.read_text())["runtimes"]
    return [r if isinstance(r, str) else f"{r['runtime']}:{r['policy']}" for r in runtimes]


def plain_process(label: str, params: Path) -> dict:
    """``--plain label`` in a fresh process: its wall seconds and its own figures."""
    seconds, lines = stamped([sys.executable, str(Path(__file__)), str(params), "--plain", label])
    figures = next(line for _, line in reversed(lines) if line.startswith('{"label"'))
    return {**json.loads(figures), "process_s": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("params", nargs="?", default=str(PARAMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    params = Path(args.params).resolve()
    if args.plain:
        print(json.dumps(plain(args.plain, params)), flush=True)
        return
    labels = labels_of(params)
    work = Path(tempfile.mkdtemp(prefix="driftscope-demo-bench-"))
    print(f"warm-up (caches): demo, then {', '.join(labels)} plainly", flush=True)
    demo(params, work / "warm-up")
    for label in labels:
        plain_process(label, params)
    demos, plains = [], {label: [] for label in labels}
    for rep in range(args.repeats):
        demos.append(demo(params, work / f"demo-{rep}"))
        for label in labels:
            plains[label].append(plain_process(label, params))
        print(f"repeat {rep + 1}: demo {demos[-1]['seconds']:.1f}s", flush=True)
    report(demos, plains)


def report(demos: list[dict], plains: dict[str, list[dict]]) -> None:
    med = statistics.median
    print(
        "\n| runtime | process s (imports, inputs, load, 2 forwards) | imports + inputs s | load s | first forward s "
        "| warm forward s |"
    )
    print("|---|---|---|---|---|---|")
    for label, runs in plains.items():
        print(
            f"| {label} | {med(r['process_s'] for r in runs):.2f} | {med(r['imports_inputs_s'] for r in runs):.2f} | "
            f"{med(r['load_s'] for r in runs):.2f} | {med(r['first_s'] for r in runs):.3f} | "
            f"{med(r['warm_s'] for r in runs):.3f} |"
        )
    seconds = [d["seconds"] for d in demos]
    processes = [sum(runs[i]["process_s"] for runs in plains.values()) for i in range(len(demos))]
    forwards = [sum(runs[i]["warm_s"] for runs in plains.values()) for i in range(len(demos))]
    by_process = sorted(s / p for s, p in zip(seconds, processes, strict=True))
    by_forward = sorted(s / f for s, f in zip(seconds, forwards, strict=True))
    print(
        f"\ndemo (driftscope run, fresh process, warm caches): {med(seconds):.1f}s (samples "
        + ", ".join(f"{s:.1f}" for s in seconds)
        + f"); first capture {med(d['first_capture'] for d in demos):.1f}s, verdict "
        f"{med(d['verdict'] for d in demos):.1f}s\n"
        f"  / the runtimes run plainly, each in its own process (sum {med(processes):.1f}s): "
        f"{med(by_process):.2f}x (spread {by_process[0]:.2f}-{by_process[-1]:.2f}x)\n"
        f"  / their warm forwards alone (sum {med(forwards):.3f}s): {med(by_forward):.0f}x"
    )
    print("\n| where the demo's time went (median of the repeats) | s |")
    print("|---|---|")
    for step in demos[0]["spans"]:
        print(f"| {step} | {med(d['spans'].get(step, 0.0) for d in demos):.1f} |")


if __name__ == "__main__":
    main()
